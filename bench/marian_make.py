#!/usr/bin/env python3
"""The model and the text of `make bench-marian` (bench/marian_bench.sh): a random MarianMTModel at
Opus-MT's shape (vocab 58101, d_model 512, 6 + 6 layers, 8 heads, FFN 2048, swish,
scale_embedding, max_position_embeddings 512, pad = decoder start 58100, eos 0, the generation
config of an Opus-MT model: bad_words_ids [[58100]], forced_eos_token_id 0, num_beams 4,
max_length 512), seeded, transformers' own initialisation (the pad row of the embedding zero, as
in Opus-MT), saved in float32 with its tokenizer; and the source sentences.

The tokenizer: a unigram SentencePiece model of 8000 pieces trained on the English fortunes
(FORTUNES/fortunes and the other English files) as source.spm and target.spm, and a vocab.json of
</s> 0, <unk> 1, the pieces, then "<extra_N>" fillers up to id 58099 and <pad> 58100 (the fillers
exist only so that the vocabulary has Opus-MT's 58101 entries; the spm never yields them, the
random model may), written by transformers' MarianTokenizer.save_pretrained.

The text: the first SENTENCES (default 64) lines of FORTUNES/fortunes of 20 to 120 characters
(lines with a tab left out), in OUT/sources.txt. They are part of the spm's training text, as a
tokenizer's training text holds most of what it later reads; the benchmark times translation.

Usage: marian_make.py OUT [SENTENCES]   (makes OUT/model, OUT/sources.txt; kept when present)
"""
import glob
import json
import os
import sys

FORTUNES = "/usr/share/games/fortunes"
VOCAB, PAD, EOS, UNK = 58101, 58100, 0, 1
PIECES = 8000
SEED = 20261128


def fortune_lines(paths):
    lines = []
    for p in sorted(paths):
        if p.endswith((".dat", ".u8")) or not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="ignore") as f:
            lines += [l.strip() for l in f if l.strip() and l.strip() != "%"]
    return lines


def english_files():
    files = [p for p in glob.glob(f"{FORTUNES}/*") if os.path.isfile(p)]
    if not files:
        sys.exit(f"marian_make.py: no fortune files in {FORTUNES} (make fortunes)")
    return files


def train_spm(work):
    import sentencepiece as spm
    text = os.path.join(work, "train.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(fortune_lines(english_files())) + "\n")
    prefix = os.path.join(work, "spm")
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=PIECES,
                                   model_type="unigram", character_coverage=1.0,
                                   unk_id=0, bos_id=-1, eos_id=1, pad_id=-1,
                                   input_sentence_size=200000, shuffle_input_sentence=False,
                                   minloglevel=2)
    return prefix + ".model"


def vocabulary(spm_path):
    """Opus-MT's layout at 58101 entries: </s> 0, <unk> 1, the pieces, fillers, <pad> last."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=spm_path)
    vocab = {"</s>": EOS, "<unk>": UNK}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if piece not in vocab:
            vocab[piece] = len(vocab)
    n = len(vocab)
    for i in range(n, PAD):
        vocab[f"<extra_{i}>"] = i
    vocab["<pad>"] = PAD
    assert len(vocab) == VOCAB and sorted(vocab.values()) == list(range(VOCAB))
    return vocab


def save_tokenizer(model_dir, work):
    import transformers as tf
    spm_path = train_spm(work)
    vocab_path = os.path.join(work, "vocab.json")
    with open(vocab_path, "w", encoding="utf-8") as f:
        json.dump(vocabulary(spm_path), f, ensure_ascii=False)
    tok = tf.MarianTokenizer(source_spm=spm_path, target_spm=spm_path, vocab=vocab_path)
    tok.save_pretrained(model_dir)


def save_model(model_dir):
    import torch
    import transformers as tf
    torch.manual_seed(SEED)
    cfg = tf.MarianConfig(vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=512,
                          encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                          decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                          max_position_embeddings=512, activation_function="swish",
                          scale_embedding=True, pad_token_id=PAD, decoder_start_token_id=PAD,
                          eos_token_id=EOS, forced_eos_token_id=EOS, bad_words_ids=[[PAD]],
                          num_beams=4, max_length=512)
    model = tf.MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.model.shared.weight[PAD].zero_()
    model.save_pretrained(model_dir, safe_serialization=True)
    gen = {"bad_words_ids": [[PAD]], "forced_eos_token_id": EOS, "num_beams": 4, "max_length": 512,
           "pad_token_id": PAD, "decoder_start_token_id": PAD, "eos_token_id": EOS}
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f)


def save_sources(path, n):
    lines = [l for l in fortune_lines([f"{FORTUNES}/fortunes"]) if 20 <= len(l) <= 120 and "\t" not in l]
    if len(lines) < n:
        sys.exit(f"marian_make.py: {FORTUNES}/fortunes has {len(lines)} usable lines, {n} asked for")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines[:n]) + "\n")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: marian_make.py OUT [SENTENCES]")
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 64
    model_dir = os.path.join(out, "model")
    os.makedirs(out, exist_ok=True)
    if not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        tmp = model_dir + ".part"
        os.makedirs(tmp, exist_ok=True)
        save_tokenizer(tmp, out)
        save_model(tmp)
        os.replace(tmp, model_dir)
    save_sources(os.path.join(out, "sources.txt"), n)


if __name__ == "__main__":
    main()
