#!/usr/bin/env python3
"""Prepare the King James Bible for training smelt's demo model.

Input : the plain-text dump of Debian's bible-kjv-text package, made with the
        `bible` program from bible-kjv (the package stores the text in its own
        compressed format, /usr/lib/bible.data, so it must be dumped):

            apt-get install -y bible-kjv-text      # pulls in bible-kjv
            bible -f Gen1:1-Rev22:21 > kjv_raw.txt

        `-f` turns pretty-printing off: one verse per line, each line led by
        its reference ("Ge1:1 In the beginning God created ...").
Output (in --out):
        kjv.txt         the whole text, one verse per line, references stripped
        train.txt       the training part (95%)
        heldout.txt     the held-out part (5%)
        heldout_ids.bin the held-out text as token ids for `smelt eval`: little-
                        endian uint16, no header; BOS (256) and then the bytes
                        of the first held-out verses, whole verses only, at
                        most MAX_HELDOUT_IDS ids in all (so <= 200,000 bytes)
        calib_ids.bin   a calibration slice of the *training* text for
                        quantization (`smelt compile --calib`), in the same
                        format: BOS, then whole training verses taken every
                        len(train) // CALIB_SPREAD verses from the first (so
                        from across the whole book), at most MAX_CALIB_IDS ids;
                        never held-out text
        split.json      sizes and the split rule, for the record

The split is deterministic: verses are gathered, in order, into chunks of at
least CHUNK_BYTES bytes (a chunk always ends at the end of a verse), and every
20th chunk (chunk index % 20 == 19) is held out. Both parts stay plain text,
one verse per line.
"""
import argparse
import json
import os
import re
import subprocess
import sys

CHUNK_BYTES = 4096
MAX_HELDOUT_IDS = 100_000
MAX_CALIB_IDS = 4096
CALIB_SPREAD = 30
BOS = 256
HOLDOUT_EVERY = 20
# "Ge1:1 ", "1Sa3:10 ", "Song2:4 ": optional digit, book abbreviation, chapter:verse.
REFERENCE = re.compile(r"^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ ")


def dump_with_bible_program():
    """Runs `bible -f Gen1:1-Rev22:21` and returns its output."""
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                         stdout=subprocess.PIPE).stdout
    return out.decode("ascii")


def verses_from_dump(raw):
    verses = []
    for number, line in enumerate(raw.splitlines(), 1):
        match = REFERENCE.match(line)
        if not match:
            sys.exit(f"line {number}: expected a verse reference, found {line[:40]!r}")
        text = line[match.end():].strip()
        if not text:
            sys.exit(f"line {number}: empty verse")
        verses.append(text)
    return verses


def split_verses(verses):
    """Returns (train_lines, heldout_lines, chunk_count)."""
    train, heldout = [], []
    chunk, chunk_bytes, chunk_index = [], 0, 0
    for verse in verses:
        chunk.append(verse)
        chunk_bytes += len(verse) + 1
        if chunk_bytes >= CHUNK_BYTES:
            (heldout if chunk_index % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).extend(chunk)
            chunk, chunk_bytes, chunk_index = [], 0, chunk_index + 1
    if chunk:  # the short last chunk
        (heldout if chunk_index % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).extend(chunk)
        chunk_index += 1
    return train, heldout, chunk_index


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def heldout_ids(lines):
    """BOS, then the bytes of whole held-out verses while they fit in MAX_HELDOUT_IDS."""
    ids = [BOS]
    for line in lines:
        data = (line + "\n").encode("utf-8")
        if len(ids) + len(data) > MAX_HELDOUT_IDS:
            break
        ids.extend(data)
    return ids


def calib_ids(train):
    """BOS, then every (len(train) // CALIB_SPREAD)-th training verse while they fit."""
    ids, every = [BOS], max(1, len(train) // CALIB_SPREAD)
    for line in train[::every]:
        data = (line + "\n").encode("utf-8")
        if len(ids) + len(data) > MAX_CALIB_IDS:
            break
        ids.extend(data)
    return ids


def write_uint16_le(path, ids):
    with open(path, "wb") as f:
        f.write(b"".join(i.to_bytes(2, "little") for i in ids))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--raw", help="output of `bible -f Gen1:1-Rev22:21` "
                        "(default: run the bible program now)")
    parser.add_argument("--out", required=True, help="folder for the prepared text")
    args = parser.parse_args()

    if args.raw:
        with open(args.raw, encoding="ascii") as f:
            raw = f.read()
    else:
        raw = dump_with_bible_program()
    verses = verses_from_dump(raw)
    train, heldout, chunks = split_verses(verses)

    os.makedirs(args.out, exist_ok=True)
    write_lines(os.path.join(args.out, "kjv.txt"), verses)
    write_lines(os.path.join(args.out, "train.txt"), train)
    write_lines(os.path.join(args.out, "heldout.txt"), heldout)
    ids = heldout_ids(heldout)
    write_uint16_le(os.path.join(args.out, "heldout_ids.bin"), ids)
    calib = calib_ids(train)
    write_uint16_le(os.path.join(args.out, "calib_ids.bin"), calib)
    summary = {
        "source": "Debian bible-kjv-text (dumped with `bible -f Gen1:1-Rev22:21`)",
        "verses": len(verses),
        "bytes": sum(len(v) + 1 for v in verses),
        "chunk_bytes": CHUNK_BYTES,
        "chunks": chunks,
        "rule": f"chunk index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1} is held out",
        "train_verses": len(train),
        "train_bytes": sum(len(v) + 1 for v in train),
        "heldout_verses": len(heldout),
        "heldout_bytes": sum(len(v) + 1 for v in heldout),
        "heldout_ids": len(ids),
        "heldout_ids_bytes_of_text": len(ids) - 1,
        "calib_ids": len(calib),
        "calib_verse_every": max(1, len(train) // CALIB_SPREAD),
    }
    with open(os.path.join(args.out, "split.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
