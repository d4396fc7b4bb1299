# lit configuration for smelt's FileCheck tests (tests/ir, tests/diag, tests/cli).
# Run from the build tree: `lit -sv build/tests` (lit.site.cfg.py there names
# the binaries and loads this file).
import os
import lit.formats

config.name = "smelt"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".ir", ".smelt", ".json", ".test"]
config.excludes = ["Inputs", "unit", "corpus", "fixtures", "reference", "CMakeLists.txt", "README.md"]
config.test_source_root = config.smelt_test_source_dir
config.test_exec_root = os.path.dirname(os.path.abspath(config.site_config_path)) \
    if hasattr(config, "site_config_path") else config.smelt_test_source_dir
config.environment["PATH"] = os.pathsep.join(
    [config.smelt_bin, config.llvm_bin, os.environ.get("PATH", "")])
# Kernels compiled by tests go to a cache of the build tree's own.
config.environment["SMELT_CACHE_DIR"] = os.path.join(config.test_exec_root, "kernel-cache")
config.substitutions.append(("%examples", os.path.join(config.smelt_source_dir, "examples")))
config.substitutions.append(("%generate", config.generate_bin))
config.substitutions.append(("%smelt_root", config.smelt_source_dir))
config.substitutions.append(("%fixtures", os.path.join(config.smelt_test_source_dir, "fixtures")))
# Sanitized builds (SMELT_SANITIZE) reserve terabytes of shadow memory: tests
# that run smelt under an address-space limit (ulimit -v) are UNSUPPORTED there.
if str(getattr(config, "smelt_sanitize", "")).upper() in ("ON", "1", "TRUE", "YES"):
    config.available_features.add("asan")
