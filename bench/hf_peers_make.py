"""Random-weight Hugging Face checkpoints for `make bench-hf` (bench/hf_peers.sh).

    python hf_peers_make.py OUT_DIR NAME

Writes OUT_DIR/NAME-f32 and OUT_DIR/NAME-bf16 (config.json + model.safetensors, made with
transformers' LlamaForCausalLM from a fixed seed at the real shape of NAME: smollm = SmolLM-135M,
tinyllama = TinyLlama-1.1B) plus a SentencePiece tokenizer.model that llama.cpp's
convert_hf_to_gguf.py needs in the directory (trained here on the fortune files; the converter pads
its vocabulary to the config's with unused tokens). Directories already complete are kept.
Needs torch, transformers and sentencepiece (the interpreter given by hf_peers.sh).
"""

import glob
import os
import sys

SHAPES = {
    "smollm": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                   tie_word_embeddings=True),
    "tinyllama": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                      tie_word_embeddings=False),
}


def train_tokenizer(out_dir):
    """A 1000-piece SentencePiece BPE model (byte fallback) on the top-level fortune files."""
    path = os.path.join(out_dir, "tokenizer.model")
    if os.path.exists(path):
        return path
    import sentencepiece as spm
    files = [f for f in glob.glob("/usr/share/games/fortunes/*")
             if os.path.isfile(f) and "." not in os.path.basename(f)]
    if not files:
        sys.exit("hf_peers_make.py: no fortune files under /usr/share/games/fortunes "
                 "(the tokenizer is trained on them)")
    spm.SentencePieceTrainer.train(
        input=",".join(sorted(files)), model_prefix=os.path.join(out_dir, "tokenizer"),
        vocab_size=1000, model_type="bpe", byte_fallback=True, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, input_sentence_size=200000, shuffle_input_sentence=True,
        minloglevel=2)
    return path


def save(model, out, tokenizer):
    """model.save_pretrained(out) with the tokenizer copied in, written under a temporary name."""
    import shutil
    tmp = out + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.copy(tokenizer, os.path.join(tmp, "tokenizer.model"))
    os.replace(tmp, out)


def make(out_dir, name):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    tokenizer = train_tokenizer(out_dir)
    f32, bf16 = (os.path.join(out_dir, f"{name}-{p}") for p in ("f32", "bf16"))
    if os.path.isdir(f32) and os.path.isdir(bf16):
        return
    torch.manual_seed(50)
    cfg = LlamaConfig(max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1,
                      eos_token_id=2, **SHAPES[name])
    with torch.no_grad():
        model = LlamaForCausalLM(cfg).eval()
        save(model, f32, tokenizer)
        save(model.to(torch.bfloat16), bf16, tokenizer)


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in SHAPES:
        sys.exit(f"usage: hf_peers_make.py OUT_DIR {'|'.join(SHAPES)}")
    os.makedirs(sys.argv[1], exist_ok=True)
    make(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
