"""models::load_hf_causal_lm against transformers: random Llama (GQA, tied and untied, all
biases, sharded), Qwen2 (q/k/v biases), Mistral and GPT-2 (tied, untied) checkpoints saved by
save_pretrained in float32 and bfloat16; graft's
logits (tests/hf_lm_check) within 1e-5 of transformers' (relative to the largest |logit|) and the
same 64 greedy tokens; a bfloat16 file run in bfloat16 within BF16_TOL; llama3 and linear
rope scaling read, a yarn rope_scaling config refused naming rope_type; `lm generate --hf
--prompt` through a tokenizer.json gives transformers' text, and through a Llama 2 style
tokenizer.model (SentencePiece) SentencePiece's decoding of transformers' ids.
Usage: hf_reference.py HF_LM_CHECK WORKDIR LM"""
import subprocess
import sys

import torch
import transformers as tf

F32_TOL = 1e-5
# bfloat16 keeps 8 significant bits (unit roundoff 2^-8 = 0.0039); a 2-layer model rounds its
# activations about 10 times on the way to the logits (embedding, 2 norms, attention, FFN per
# layer, final norm), so errors reach ~10 * 0.0039 of the largest logit: 0.04.
BF16_TOL = 0.04
NEW = 64
BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
            num_attention_heads=4, rms_norm_eps=1e-5, max_position_embeddings=256)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
GPT2 = dict(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=96,
            eos_token_id=96)
CLASSES = {"llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
           "mistral": tf.MistralForCausalLM, "gpt2": tf.GPT2LMHeadModel}


def cases():
    yield "llama_gqa_untied", tf.LlamaConfig(**BASE, num_key_value_heads=2, rope_theta=500000.0,
                                             tie_word_embeddings=False)
    yield "llama_tied", tf.LlamaConfig(**BASE, num_key_value_heads=4, tie_word_embeddings=True)
    yield "qwen2_biases", tf.Qwen2Config(**BASE, num_key_value_heads=2, rope_theta=1e6,
                                         tie_word_embeddings=True, use_sliding_window=False)
    yield "mistral", tf.MistralConfig(**BASE, num_key_value_heads=2, sliding_window=None,
                                      tie_word_embeddings=False)
    yield "llama_biases_sharded", tf.LlamaConfig(**BASE, num_key_value_heads=1,
                                                 attention_bias=True, mlp_bias=True)
    yield "llama3_rope", tf.LlamaConfig(**BASE, num_key_value_heads=2, rope_theta=500000.0,
                                        rope_scaling=LLAMA3)
    yield "linear_rope", tf.LlamaConfig(**BASE, rope_scaling={"rope_type": "linear",
                                                              "factor": 2.0})
    yield "gpt2_tied", tf.GPT2Config(**GPT2)
    yield "gpt2_untied_relu", tf.GPT2Config(**GPT2, tie_word_embeddings=False,
                                            activation_function="relu", n_inner=96)


def random_model(cls, cfg, seed):
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    with torch.no_grad():  # std 0.2 so that greedy argmax margins dwarf rounding
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.2)
    return model


def reference(model, ids):
    with torch.no_grad():
        x = torch.tensor([ids])
        logits = model(x).logits[0].float()
        for _ in range(NEW):  # greedy, no eos stop
            nxt = model(x).logits[0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], 1)
    return logits, x[0, len(ids):].tolist()


def graft(check, d, ids, extra=()):
    r = subprocess.run([check, d, ",".join(map(str, ids)), str(NEW), *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hf_lm_check {d} failed: {r.stderr}")
    rows = [l.split() for l in r.stdout.splitlines()]
    logits = torch.tensor([[float(v) for v in row[1:]] for row in rows if row[0] == "logits"])
    gen = [int(v) for row in rows if row[0] == "generated" for v in row[1:]]
    return logits, gen


def compare(what, got, want, tol, gen=None, want_gen=None):
    err = ((got - want).abs().max() / want.abs().max()).item()
    same = gen is None or gen == want_gen
    print(f"{what}: max |graft - transformers| / max |logit| = {err:.2e} (tol {tol:g})"
          + ("" if gen is None else f", {NEW} greedy tokens {'identical' if same else 'DIFFER'}"))
    return err <= tol and same


def check_case(check, work, name, cfg, seed):
    cls = CLASSES[cfg.model_type]
    model = random_model(cls, cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    ids = [0] + torch.randint(1, cfg.vocab_size, (11,), generator=gen).tolist()  # id 0 is no pad
    ok = True
    f32, b16 = f"{work}/{name}_f32", f"{work}/{name}_bf16"
    model.save_pretrained(f32, max_shard_size="40KB" if "sharded" in name else "5GB")
    want, want_gen = reference(model, ids)
    got, gen = graft(check, f32, ids)
    ok &= compare(f"{name} float32", got, want, F32_TOL, gen, want_gen)
    model.to(torch.bfloat16).save_pretrained(b16)
    wide = cls.from_pretrained(b16, dtype=torch.float32, attn_implementation="eager").eval()
    want, want_gen = reference(wide, ids)
    got, gen = graft(check, b16, ids, ["float32"])
    ok &= compare(f"{name} bfloat16 file widened", got, want, F32_TOL, gen, want_gen)
    got, _ = graft(check, b16, ids)
    ok &= compare(f"{name} bfloat16 file run in bfloat16", got, want, BF16_TOL)
    return ok


def check_yarn_refused(check, work):
    cfg = tf.LlamaConfig(**BASE, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 64})
    d = f"{work}/yarn"
    random_model(tf.LlamaForCausalLM, cfg, 9).save_pretrained(d)
    r = subprocess.run([check, d, "1,2"], capture_output=True, text=True)
    print(f"yarn rope_scaling: exit {r.returncode}: {r.stderr.strip()}")
    return r.returncode == 2 and "rope_type" in r.stderr


def check_text_prompt(lm, work):
    """`lm generate --hf DIR --prompt TEXT`: a GPT-2 with a byte-level BPE trained on the
    fortunes; its text equals transformers' greedy generate() decoded by `tokenizers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["A fool and his money are soon parted.", "Ça va? Grüße, 日本"] * 50,
                            trainer)
    cfg = tf.GPT2Config(**{**GPT2, "vocab_size": tok.get_vocab_size(), "bos_token_id": 0,
                           "eos_token_id": 0})
    model = random_model(tf.GPT2LMHeadModel, cfg, 11)
    d = f"{work}/gpt2_text"
    model.save_pretrained(d)
    tok.save(f"{d}/tokenizer.json")
    text = "A fool and his money"
    ids = tok.encode(text).ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                             pad_token_id=0, eos_token_id=0)[0, len(ids):].tolist()
    want = text + tok.decode(out, skip_special_tokens=True) + "\n"
    ok = True
    for extra in ([], ["--stream"]):
        r = subprocess.run([lm, "generate", "--hf", d, "--prompt", text, "--max-new", str(NEW),
                            *extra], capture_output=True)
        same = r.returncode == 0 and r.stdout.decode("utf-8", "replace") == want
        print(f"lm generate --hf --prompt {' '.join(extra)}: "
              f"{'same text' if same else 'DIFFERS: ' + repr(r.stdout) + r.stderr.decode()}")
        ok &= same
    return ok


def check_spm_prompt(lm, work):
    """`lm generate --hf DIR --prompt TEXT` on a Llama directory laid out as Llama 2's: a
    SentencePiece BPE tokenizer.model (byte fallback, trained here) beside the tokenizer.json
    transformers writes for it (Metaspace, which lm refuses and passes over); the text equals
    SentencePiece's decoding of the prompt and transformers' greedy continuation."""
    import io
    import sentencepiece as spm
    model_file = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["A fool and his money are soon parted.", "Ça va? Grüße"] * 50),
        model_writer=model_file, model_type="bpe", vocab_size=300, byte_fallback=True,
        split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model_file.getvalue())
    d = f"{work}/llama_spm"
    cfg = tf.LlamaConfig(**{**BASE, "vocab_size": sp.get_piece_size()}, num_key_value_heads=2,
                         bos_token_id=1, eos_token_id=2)
    random_model(tf.LlamaForCausalLM, cfg, 12).save_pretrained(d)
    with open(f"{d}/tokenizer.model", "wb") as f:
        f.write(model_file.getvalue())
    tf.AutoTokenizer.from_pretrained(d, tokenizer_class="LlamaTokenizerFast").save_pretrained(d)
    text = "A fool and his money"
    ids = sp.encode(text, add_bos=True)
    with torch.no_grad():
        out = random_model(tf.LlamaForCausalLM, cfg, 12).generate(
            torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
            eos_token_id=2)[0].tolist()
    want = sp.decode([i for i in out if not (sp.is_control(i) or sp.is_unknown(i))]) + "\n"
    ok = True
    for extra in ([], ["--stream"]):
        r = subprocess.run([lm, "generate", "--hf", d, "--prompt", text, "--max-new", str(NEW),
                            *extra], capture_output=True)
        same = r.returncode == 0 and r.stdout.decode("utf-8", "surrogateescape") == want
        print(f"lm generate --hf --prompt {' '.join(extra)} (tokenizer.model): "
              f"{'same text' if same else 'DIFFERS: ' + repr(r.stdout) + r.stderr.decode()}")
        ok &= same
    return ok


def main():
    check, work, lm = sys.argv[1], sys.argv[2], sys.argv[3]
    print(f"torch {torch.__version__}, transformers {tf.__version__}")
    ok = True
    for seed, (name, cfg) in enumerate(cases()):
        ok &= check_case(check, work, name, cfg, seed + 1)
    ok &= check_yarn_refused(check, work)
    ok &= check_text_prompt(lm, work)
    ok &= check_spm_prompt(lm, work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
