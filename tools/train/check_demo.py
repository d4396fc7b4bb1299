#!/usr/bin/env python3
"""Checks the committed demo model against Hugging Face transformers.

Loads tests/fixtures/demo with transformers' LlamaForCausalLM (fp32), runs
BOS + "In the beginning" and N greedy tokens through one full forward pass,
and compares every row with what `smelt run --dump-logits` computes for the
same prompt: max abs error <= 1e-4 of the logit range at every row (the
reference backend's bound, docs/design.md section 7) and the same greedy tokens.

    python3 tools/train/check_demo.py [--smelt build/cli/smelt] [--backend ref] [--tokens 64]

Needs torch, transformers and numpy from PyPI (tooling only: the build and
the tests never need them).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "tests", "fixtures", "demo")
BOS = 256
TOLERANCE = 1e-4


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smelt", default=os.path.join(ROOT, "build", "cli", "smelt"))
    parser.add_argument("--backend", default="ref")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", default="In the beginning")
    args = parser.parse_args()

    prompt = [BOS] + list(args.prompt.encode())
    model = LlamaForCausalLM.from_pretrained(DEMO, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with tempfile.TemporaryDirectory() as work:
        dump = os.path.join(work, "logits.npy")
        out = subprocess.run(
            [args.smelt, "run", os.path.join(ROOT, "examples", "llama.smelt"),
             "--config", os.path.join(DEMO, "config.json"), "--weights", os.path.join(DEMO, "model.safetensors"),
             "--backend", args.backend, "--precision", "f32", "--prompt-ids", ",".join(map(str, prompt)),
             "--max-tokens", str(args.tokens), "--dump-logits", dump],
            check=True, capture_output=True, text=True).stdout
        smelt_logits = np.load(dump)
    smelt_tokens = [int(t) for t in out.split("tokens:")[1].split()]

    ids = torch.tensor([prompt + smelt_tokens[:-1]])
    with torch.no_grad():
        hf = model(ids).logits[0].numpy()[len(prompt) - 1:]
    hf_tokens = hf.argmax(axis=1).tolist()
    span = float(hf.max() - hf.min())
    worst = float(np.abs(hf - smelt_logits).max(axis=1).max())
    print(f"{args.backend}: {len(hf_tokens)} rows, max abs error {worst:.3g} = {worst / span:.3g} of the logit "
          f"range {span:.2f} (bound {TOLERANCE}); greedy tokens {'identical' if hf_tokens == smelt_tokens else 'DIFFER'}")
    print("text:", bytes(t for t in smelt_tokens if t < 256).decode(errors="replace"))
    ok = worst <= TOLERANCE * span and hf_tokens == smelt_tokens
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
