"""The markdown table of `make bench-hf` from BUILD/hf-bench/results.jsonl (bench/hf_peers.sh).

    python3 hf_peers_table.py BUILD/hf-bench > bench/results/hf_llama.md

Standard library only. Weight bytes read per generated token come from each checkpoint's
config.json: every linear weight of the layers plus the output projection (the embedding lookup
reads one row), at the bytes per weight each engine holds: graft fp32 4, bf16 2, int8 1 (a tied
output projection is the embedding's int8 form); llama.cpp F32 4, BF16 2, Q8_0 34/32 (blocks of 32 int8 + an f16 scale, the tied
token_embd included). Bytes/token x tokens/s is the weight bandwidth generation reaches, set
against the triad's.
"""

import json
import os
import platform
import sys

ROWS = [("fp32", "f32"), ("bf16", "bf16"), ("int8", "q8_0")]
GRAFT_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0}
LLAMA_BYTES = {"f32": 4.0, "bf16": 2.0, "q8_0": 34.0 / 32.0}
NAMES = {"smollm": "SmolLM-135M shape", "tinyllama": "TinyLlama-1.1B shape"}


def weight_counts(cfg):
    """(weights of the layers' linears, weights of the output projection)."""
    d, ff, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * ff
    return layers * per_layer, cfg["vocab_size"] * d


def bytes_per_token(cfg, graft_p, llama_t):
    """Weight bytes one generated token reads: (graft, llama.cpp)."""
    body, out = weight_counts(cfg)
    return ((body + out) * GRAFT_BYTES[graft_p],
            (body + out) * LLAMA_BYTES[llama_t])


def load(out_dir):
    res = {}
    with open(os.path.join(out_dir, "results.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            key = r.get("precision") or os.path.basename(r.get("gguf", "")).rsplit("-", 1)[-1][:-5]
            res[(r["model"], r.get("engine", r["what"]), key)] = r
    return res


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average():
    """The 1/5/15-minute load averages: over the core count, other processes shared the cores."""
    try:
        with open("/proc/loadavg") as f:
            return " / ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def row(model, cfg, res, triad, p, t):
    g, l = res.get((model, "graft", p)), res.get((model, "llama.cpp", t))
    if not g or not l:
        return None
    bg, bl = bytes_per_token(cfg, p, t)
    bw_g, bw_l = bg * g["tg_tok_s"] / 1e9, bl * l["tg_tok_s"] / 1e9
    return (f"| {NAMES.get(model, model)} | {p} / {t.upper()} "
            f"| {g['pp_tok_s']:.1f} | {l['pp_tok_s']:.1f} | {g['pp_tok_s'] / l['pp_tok_s']:.2f} "
            f"| {g['tg_tok_s']:.2f} | {l['tg_tok_s']:.2f} | {g['tg_tok_s'] / l['tg_tok_s']:.2f} "
            f"| {g['peak_rss_mib']:.0f} | {l['peak_rss_mib']:.0f} "
            f"| {g['load_s']:.2f} | {l['load_s']:.2f} "
            f"| {bg / 1e6:.0f} / {bl / 1e6:.0f} | {bw_g:.1f} / {bw_l:.1f} "
            f"({100 * bw_g / triad:.0f}% / {100 * bw_l / triad:.0f}%) |")


def main():
    out_dir = sys.argv[1]
    res = load(out_dir)
    triad = res[("machine", "triad", "")]["gbs"] if ("machine", "triad", "") in res else float("nan")
    any_r = next((r for r in res.values() if r.get("engine") == "llama.cpp"), {})
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; threads "
          f"{any_r.get('threads', '?')}; triad bandwidth {triad:.1f} GB/s; llama-cpp-python "
          f"{any_r.get('llama_cpp_python', '?')} (built from source, GGML_NATIVE); prompt "
          f"{any_r.get('prompt', '?')} tokens, generation {any_r.get('gen', '?')} tokens at batch 1, "
          f"median of {any_r.get('repeats', '?')} runs; load average when the table was written "
          f"{load_average()} (above the core count means other processes shared the cores).\n")
    print("| model | graft / GGUF | pp512 graft tok/s | pp512 llama.cpp | ratio | tg128 graft tok/s "
          "| tg128 llama.cpp | ratio | peak RSS graft MiB | llama.cpp MiB | load graft s "
          "| llama.cpp s | weight MB/token graft / llama.cpp | weight GB/s (of triad) |")
    print("|" + "---|" * 14)
    for model in ("smollm", "tinyllama"):
        cfg_path = os.path.join(out_dir, f"{model}-f32", "config.json")
        if not os.path.exists(cfg_path):
            continue
        with open(cfg_path) as f:
            cfg = json.load(f)
        for p, t in ROWS:
            line = row(model, cfg, res, triad, p, t)
            if line:
                print(line)


if __name__ == "__main__":
    main()
