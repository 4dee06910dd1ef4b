"""transformers on PyTorch: the second peer of `make bench-hf` (next to llama.cpp and graft's
hf_lm_bench), on the same Hugging Face directory and the same prompt.

    python hf_peers_torch.py DIR [--precision fp32|bf16|int8] [--mode eager|compiled]
                             [--prompt 512] [--gen 128] [--threads 2] [--repeats 3]

Load: AutoModelForCausalLM.from_pretrained (dtype float32, or bfloat16 for bf16; int8: float32
then torch.ao's dynamic int8 quantization of every nn.Linear). compiled: transformers' recipe, a
static KV cache and model.forward through torch.compile. A warm-up run (which compiles) is not
counted. Per repeat, greedy generate() calls: one new token (prompt tokens/s: the prompt's
forward dominates) and --gen + 1 new tokens (generation tokens/s: --gen over the time they add). Prints one line "RESULT {json}" with the
medians, the load seconds and the peak RSS (getrusage).
"""

import argparse
import json
import resource
import statistics
import time


def prompt_ids(n, vocab):
    """The prompt hf_lm_bench.cpp feeds: a fixed walk over [1, vocab)."""
    return [1 + (t * 7919 + 104729) % (vocab - 1) for t in range(n)]


def load(path, precision, mode):
    import torch
    import transformers as tf
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if precision == "int8":
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    if mode == "compiled":  # transformers' recipe: a static KV cache, forward compiled
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, fullgraph=True)
    return model


def timed_generate(model, x, new):
    import torch
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0)
    assert out.shape[1] == x.shape[1] + new
    return time.perf_counter() - t0


def one_run(model, prompt, gen):
    """Prompt tokens/s (a generate() of one token) and generation tokens/s (the time gen more
    tokens add), both greedy through generate()."""
    import torch
    x = torch.tensor([prompt])
    first = timed_generate(model, x, 1)
    full = timed_generate(model, x, gen + 1)
    return len(prompt) / first, gen / max(full - first, 1e-9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"])
    ap.add_argument("--mode", default="eager", choices=["eager", "compiled"])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    model = load(a.dir, a.precision, a.mode)
    load_s = time.perf_counter() - t0
    prompt = prompt_ids(a.prompt, model.config.vocab_size)
    one_run(model, prompt, a.gen)  # warm-up (compiled: compiles every shape used); not counted
    runs = [one_run(model, prompt, a.gen) for _ in range(a.repeats)]
    print("RESULT " + json.dumps({
        "what": "hf_lm", "engine": f"transformers-{a.mode}", "precision": a.precision,
        "torch": torch.__version__, "threads": a.threads,
        "pp_tok_s": statistics.median(r[0] for r in runs),
        "tg_tok_s": statistics.median(r[1] for r in runs),
        "load_s": load_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
