# Turns a text file into a C source defining `const char NAME[]` with its
# bytes and a terminating NUL, so that the smelt binary carries the header
# it hands to NVRTC and to the host compiler:
#   cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P embed_text.cmake
file(READ ${INPUT} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n    " bytes "${bytes}")
file(WRITE ${OUTPUT} "/* Generated from ${INPUT} by codegen/embed_text.cmake. */\nconst char ${NAME}[] = {\n    ${bytes}0x00};\n")
