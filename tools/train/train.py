#!/usr/bin/env python3
"""Train smelt's bundled demo model: a byte-level Llama on the King James Bible.

Reads the text made by prepare_data.py, trains transformers' LlamaForCausalLM
on one CPU thread, and exports the Hugging Face layout into --fixture:
config.json, model.safetensors (bf16), train_log.csv, loss.svg and
heldout_ids.bin. Training checkpoints into --work after every evaluation and
resumes from there when started again, so it can be stopped (or cut by
--time-limit-min or --stop-at-step) and continued by a later run; the result does not depend on
where it was cut, because the batch of step s is drawn from a generator seeded
with (seed, s).

Tokens: byte b is token b (0..255); BOS = 256, EOS = 257 (reserved: the
training text has no document ends, so EOS is never seen). A training window
is BOS followed by 256 bytes of the training text; input = its first 256
tokens, targets = the 256 bytes. Half the windows begin at the start of a
verse, half at any byte, so that the model handles both a fresh start and a
context cut mid-verse.

Held-out loss: mean cross-entropy (nats per byte) over windows of the held-out
text, each BOS + 256 bytes starting at a verse start, windows not
overlapping; bits per byte = nats / ln 2. During training a fixed subset of
EVAL_WINDOWS_DURING_TRAINING windows is used; the final numbers use them all.
"""
import argparse
import csv
import fcntl
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

BOS, EOS, VOCAB_SIZE = 256, 257, 258
SEQ_LEN = 256
EVAL_WINDOWS_DURING_TRAINING = 128
LOG_FIELDS = ["step", "tokens", "lr", "train_loss", "heldout_loss", "heldout_bpb", "elapsed_s"]


def model_config():
    """4 layers, width 256, 8 query heads of 32 over 2 KV heads, SwiGLU 768: 3.15M params."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=None,
        initializer_range=0.02,
    )


# ---------------------------------------------------------------- data

def load_text(path):
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    verse_starts = np.concatenate([[0], np.nonzero(data == ord("\n"))[0] + 1])
    return torch.from_numpy(data.astype(np.int64)), torch.from_numpy(verse_starts)


def training_batch(data, verse_starts, step, batch_size, seed):
    """The batch of step `step`: (inputs, targets), each [batch_size, SEQ_LEN]."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    last_start = len(data) - SEQ_LEN
    usable_verse_starts = verse_starts[verse_starts <= last_start]
    at_verse = torch.rand(batch_size, generator=generator) < 0.5
    verse_pick = usable_verse_starts[torch.randint(len(usable_verse_starts), (batch_size,), generator=generator)]
    byte_pick = torch.randint(last_start + 1, (batch_size,), generator=generator)
    starts = torch.where(at_verse, verse_pick, byte_pick)
    text = torch.stack([data[s:s + SEQ_LEN] for s in starts.tolist()])
    bos = torch.full((batch_size, 1), BOS, dtype=torch.int64)
    window = torch.cat([bos, text], dim=1)  # [batch, SEQ_LEN + 1]
    return window[:, :-1], window[:, 1:]


def heldout_windows(data, verse_starts):
    """Non-overlapping BOS + SEQ_LEN-byte windows starting at verse starts: [n, SEQ_LEN + 1]."""
    windows, next_free = [], 0
    for start in verse_starts.tolist():
        if start < next_free or start + SEQ_LEN > len(data):
            continue
        windows.append(torch.cat([torch.tensor([BOS]), data[start:start + SEQ_LEN]]))
        next_free = start + SEQ_LEN
    return torch.stack(windows)


# ---------------------------------------------------------------- model

def cross_entropy(model, inputs, targets, amp):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), targets.reshape(-1))


@torch.no_grad()
def evaluate(model, windows, amp, batch_size=32):
    """Mean held-out loss in nats per byte."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i:i + batch_size]
        loss = cross_entropy(model, chunk[:, :-1], chunk[:, 1:], amp)
        total += loss.item() * chunk[:, 1:].numel()
        count += chunk[:, 1:].numel()
    model.train()
    return total / count


def learning_rate(step, args):
    """Linear warmup to --lr, then cosine down to --lr * --min-lr-ratio at --max-steps."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
    floor = args.lr * args.min_lr_ratio
    return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, args):
    """AdamW; weight decay on matrices only (not on the RMSNorm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


# ---------------------------------------------------------------- checkpoint and log

def checkpoint_path(args):
    return os.path.join(args.work, "checkpoint.pt")


def log_path(args):
    return os.path.join(args.work, "train_log.csv")


def save_checkpoint(args, model, optimizer, step, elapsed):
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "step": step, "elapsed_s": elapsed, "args": vars(args)}
    temporary = checkpoint_path(args) + ".tmp"
    torch.save(state, temporary)
    os.replace(temporary, checkpoint_path(args))


def read_log(args):
    if not os.path.exists(log_path(args)):
        return []
    with open(log_path(args), newline="") as f:
        return list(csv.DictReader(f))


def write_log(args, rows):
    temporary = log_path(args) + ".tmp"
    with open(temporary, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=LOG_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(temporary, log_path(args))


# ---------------------------------------------------------------- training

def train(args):
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)
    train_data, train_verses = load_text(os.path.join(args.data, "train.txt"))
    heldout_data, heldout_verses = load_text(os.path.join(args.data, "heldout.txt"))
    all_windows = heldout_windows(heldout_data, heldout_verses)
    stride = max(1, len(all_windows) // EVAL_WINDOWS_DURING_TRAINING)
    eval_windows = all_windows[::stride][:EVAL_WINDOWS_DURING_TRAINING]

    model = LlamaForCausalLM(model_config())
    model.train()
    optimizer = make_optimizer(model, args)
    step, elapsed_before = 0, 0.0
    rows = []
    if os.path.exists(checkpoint_path(args)):
        state = torch.load(checkpoint_path(args), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed_before = state["step"], state["elapsed_s"]
        rows = [r for r in read_log(args) if int(r["step"]) <= step]  # drop rows past the checkpoint
        write_log(args, rows)
        print(f"resumed at step {step} ({elapsed_before:.0f} s trained so far)", flush=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params} parameters; {len(train_data)} training bytes; "
          f"{len(all_windows)} held-out windows ({len(eval_windows)} during training)", flush=True)

    started = time.time()
    recent_losses = []

    def elapsed():
        return elapsed_before + time.time() - started

    def log_and_checkpoint(current_step):
        heldout = evaluate(model, eval_windows, args.amp)
        train_loss = sum(recent_losses) / len(recent_losses) if recent_losses else float("nan")
        recent_losses.clear()
        row = {"step": current_step, "tokens": current_step * args.batch_size * SEQ_LEN,
               "lr": f"{learning_rate(max(0, current_step - 1), args):.6g}",
               "train_loss": f"{train_loss:.4f}", "heldout_loss": f"{heldout:.4f}",
               "heldout_bpb": f"{heldout / math.log(2):.4f}", "elapsed_s": f"{elapsed():.0f}"}
        rows.append(row)
        write_log(args, rows)
        save_checkpoint(args, model, optimizer, current_step, elapsed())
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    if step == 0 and not rows:
        log_and_checkpoint(0)
    while step < args.max_steps:
        if args.stop_at_step and step >= args.stop_at_step:
            save_checkpoint(args, model, optimizer, step, elapsed())
            print(f"stopped at step {step} as asked; run again to resume", flush=True)
            return False
        if args.time_limit_min and time.time() - started > args.time_limit_min * 60:
            save_checkpoint(args, model, optimizer, step, elapsed())
            print(f"time limit reached at step {step}; checkpoint saved; run again to resume", flush=True)
            return False
        lr = learning_rate(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = training_batch(train_data, train_verses, step, args.batch_size, args.seed)
        loss = cross_entropy(model, inputs, targets, args.amp)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent_losses.append(loss.item())
        step += 1
        if step % args.eval_every == 0 or step == args.max_steps:
            log_and_checkpoint(step)
    return True


# ---------------------------------------------------------------- export

def write_loss_svg(rows, path):
    """Train and held-out loss against tokens seen, as a hand-written SVG."""
    points = [(int(r["tokens"]), float(r["train_loss"]), float(r["heldout_loss"])) for r in rows]
    width, height, left, right, top, bottom = 640, 400, 60, 20, 30, 50
    max_tokens = max(p[0] for p in points) or 1
    losses = [v for p in points for v in p[1:] if not math.isnan(v)]
    y_max = math.ceil(max(losses))
    y_min = 0.0

    def x_of(tokens):
        return left + (width - left - right) * tokens / max_tokens

    def y_of(loss):
        return top + (height - top - bottom) * (y_max - loss) / (y_max - y_min)

    def polyline(index, colour):
        coords = " ".join(f"{x_of(p[0]):.1f},{y_of(p[index]):.1f}" for p in points if not math.isnan(p[index]))
        return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>'

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14">'
             f'smelt demo model (byte-level Llama, KJV): loss in nats per byte</text>']
    for tick in range(int(y_min), y_max + 1):
        y = y_of(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    millions = max_tokens / 1e6
    tick_step = 1 if millions <= 10 else 2 if millions <= 20 else 5
    tick = 0
    while tick <= millions:
        x = x_of(tick * 1e6)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#eee"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - bottom + 16}" text-anchor="middle">{tick}</text>')
        tick += tick_step
    parts.append(f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">'
                 f'tokens (bytes) seen, millions</text>')
    parts.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
                 f'fill="none" stroke="black"/>')
    parts.append(polyline(1, "#1f77b4"))
    parts.append(polyline(2, "#d62728"))
    legend_x = width - right - 150
    parts.append(f'<line x1="{legend_x}" y1="{top + 20}" x2="{legend_x + 25}" y2="{top + 20}" '
                 f'stroke="#1f77b4" stroke-width="2"/>')
    parts.append(f'<text x="{legend_x + 30}" y="{top + 24}">train</text>')
    parts.append(f'<line x1="{legend_x}" y1="{top + 38}" x2="{legend_x + 25}" y2="{top + 38}" '
                 f'stroke="#d62728" stroke-width="2"/>')
    parts.append(f'<text x="{legend_x + 30}" y="{top + 42}">held-out</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def export_config(config, path):
    """config.json as save_pretrained writes it, plus a top-level rope_theta.

    transformers 5 keeps rope_theta only inside rope_parameters; smelt binds
    top-level keys, as hub configs of Llama have them.
    """
    with tempfile.TemporaryDirectory() as folder:
        config.save_pretrained(folder)
        with open(os.path.join(folder, "config.json")) as f:
            values = json.load(f)
    values["architectures"] = ["LlamaForCausalLM"]
    values["dtype"] = "bfloat16"
    values["rope_theta"] = values["rope_parameters"]["rope_theta"]
    with open(path, "w") as f:
        json.dump(dict(sorted(values.items())), f, indent=2)
        f.write("\n")


def greedy(model, prompt_ids, count):
    """Greedy continuation of prompt_ids by `count` tokens (full recompute; the model is tiny)."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(count):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt_ids):]


def decode(ids):
    return "".join(chr(i) if i < 256 else ("<bos>" if i == BOS else "<eos>") for i in ids)


def export(args):
    state = torch.load(checkpoint_path(args), weights_only=False)
    config = model_config()
    model = LlamaForCausalLM(config)
    model.load_state_dict(state["model"])
    os.makedirs(args.fixture, exist_ok=True)

    weights = {name: tensor.detach().to(torch.bfloat16).contiguous()
               for name, tensor in model.state_dict().items()}
    save_file(weights, os.path.join(args.fixture, "model.safetensors"), metadata={"format": "pt"})
    export_config(config, os.path.join(args.fixture, "config.json"))
    rows = read_log(args)
    with open(os.path.join(args.fixture, "train_log.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=LOG_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    write_loss_svg(rows, os.path.join(args.fixture, "loss.svg"))
    shutil.copyfile(os.path.join(args.data, "heldout_ids.bin"), os.path.join(args.fixture, "heldout_ids.bin"))

    # Load what was written, as a user would, and measure it.
    loaded, info = LlamaForCausalLM.from_pretrained(args.fixture, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"from_pretrained reported {problems}")
    loaded.eval()
    heldout_data, heldout_verses = load_text(os.path.join(args.data, "heldout.txt"))
    windows = heldout_windows(heldout_data, heldout_verses)
    heldout_bf16 = evaluate(loaded, windows, amp=False)
    heldout_master = evaluate(model, windows, amp=False)
    size = os.path.getsize(os.path.join(args.fixture, "model.safetensors"))
    params = sum(t.numel() for t in weights.values())
    print(f"from_pretrained: no missing, unexpected or mismatched keys")
    print(f"parameters: {params}; model.safetensors: {size} bytes; tensors: {len(weights)}")
    print(f"steps: {state['step']}; training time: {state['elapsed_s']:.0f} s")
    print(f"held-out (all {len(windows)} windows, fp32 master weights): {heldout_master:.4f} nats/byte, "
          f"{heldout_master / math.log(2):.4f} bits/byte")
    print(f"held-out (all {len(windows)} windows, exported bf16 weights): {heldout_bf16:.4f} nats/byte, "
          f"{heldout_bf16 / math.log(2):.4f} bits/byte")
    for prompt, count in (("In the beginning", 200), ("In the", 40)):
        ids = [BOS] + list(prompt.encode())
        out = greedy(loaded, ids, count)
        print(f"greedy {count} from BOS + {prompt!r}:")
        print(f"  ids: {','.join(map(str, out))}")
        print(f"  text: {prompt + decode(out)!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="folder written by prepare_data.py")
    parser.add_argument("--work", required=True, help="folder for checkpoint.pt and the running log")
    parser.add_argument("--fixture", required=True, help="folder for the exported model (tests/fixtures/demo)")
    parser.add_argument("--max-steps", type=int, default=1250)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1611)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves a core to others)")
    parser.add_argument("--no-amp", dest="amp", action="store_false",
                        help="train in fp32 (default: bf16 autocast for the matmuls, fp32 master weights)")
    parser.add_argument("--time-limit-min", type=float, default=0,
                        help="stop (after a checkpoint) when this many minutes have passed; 0 = no limit")
    parser.add_argument("--stop-at-step", type=int, default=0,
                        help="stop (after a checkpoint) at this step; 0 = run to --max-steps")
    parser.add_argument("--export-only", action="store_true", help="skip training; export the checkpoint")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    # Two runs sharing a --work folder would overwrite each other's checkpoint and log.
    os.makedirs(args.work, exist_ok=True)
    lock = open(os.path.join(args.work, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another train.py is using {args.work}; stop it first")

    if not args.export_only and not train(args):
        return
    export(args)


if __name__ == "__main__":
    main()
