"""llama.cpp's side of `make bench-hf` (bench/hf_peers.sh runs it next to hf_lm_bench).

    python hf_peers_llama.py MODEL.gguf [--prompt 512] [--gen 128] [--threads 2] [--repeats 3]

Times a GGUF file through llama-cpp-python the way hf_lm_bench times graft: load (the Llama
construction), then per repeat the same prompt (prompt_ids(), as hf_lm_bench.cpp) in one batch,
then --gen single-token steps, each the greedy argmax of the last logits. Prompt and generation
tokens/s come from llama.cpp's own perf counters (llama_perf_context: t_p_eval_ms over n_p_eval,
t_eval_ms over n_eval); wall-clock generation tokens/s (argmax and Python included) is printed
beside them. Prints one line "RESULT {json}" with the medians and the peak RSS (getrusage).
"""

import argparse
import json
import resource
import statistics
import sys
import time


def prompt_ids(n, vocab):
    """The prompt hf_lm_bench.cpp feeds: a fixed walk over [1, vocab)."""
    return [1 + (t * 7919 + 104729) % (vocab - 1) for t in range(n)]


def greedy(llm, llama_cpp):
    """The argmax of the last evaluated token's logits (llama.cpp's own buffer, not copied)."""
    import numpy as np
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                   shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def one_run(llm, llama_cpp, prompt, gen):
    """One prompt + gen greedy steps; the perf counters' pp and tg tokens/s and the wall tg."""
    llm.reset()
    llama_cpp.llama_perf_context_reset(llm.ctx)
    llm.eval(prompt)
    tok = greedy(llm, llama_cpp)
    t0 = time.perf_counter()
    for _ in range(gen):
        llm.eval([tok])
        tok = greedy(llm, llama_cpp)
    wall = time.perf_counter() - t0
    perf = llama_cpp.llama_perf_context(llm.ctx)
    if perf.n_p_eval != len(prompt) or perf.n_eval != gen:
        sys.exit(f"hf_peers_llama.py: llama.cpp counted {perf.n_p_eval} prompt and "
                 f"{perf.n_eval} generated tokens, not {len(prompt)} and {gen}")
    return (perf.n_p_eval / perf.t_p_eval_ms * 1e3, perf.n_eval / perf.t_eval_ms * 1e3,
            gen / wall)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import llama_cpp
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=a.prompt + a.gen + 8, n_batch=a.prompt,
                          n_ubatch=a.prompt, n_threads=a.threads, n_threads_batch=a.threads,
                          use_mmap=True, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    prompt = prompt_ids(a.prompt, llm.n_vocab())
    runs = [one_run(llm, llama_cpp, prompt, a.gen) for _ in range(a.repeats)]
    pp, tg, tg_wall = (statistics.median(r[i] for r in runs) for i in range(3))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps({
        "what": "hf_lm", "engine": "llama.cpp", "gguf": a.gguf, "prompt": a.prompt,
        "gen": a.gen, "repeats": a.repeats, "threads": a.threads, "pp_tok_s": pp,
        "tg_tok_s": tg, "tg_wall_tok_s": tg_wall, "load_s": load_s, "peak_rss_mib": rss_mib,
        "llama_cpp_python": llama_cpp.__version__}), flush=True)


if __name__ == "__main__":
    main()
