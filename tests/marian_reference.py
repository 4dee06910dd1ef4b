"""models::load_hf_marian against transformers: a random MarianMTModel (Opus-MT's layout: swish,
scale_embedding, pad = decoder start, final_logits_bias) saved by save_pretrained in float32 and
bfloat16; graft's teacher-forced logits (tests/marian_check) within 1e-5 of transformers'
(relative to the largest |logit|) on a padded batch of two sources, the same 64 greedy tokens,
and the same ids as generate(num_beams=4) with bad_words_ids [[pad]] and forced_eos_token_id;
a bfloat16 file run in bfloat16 within BF16_TOL; a config with share_encoder_decoder_embeddings
false refused naming it. Then text::MarianTokenizer against transformers' MarianTokenizer on every
line of the fortune files (when installed): source.spm and target.spm trained here with
sentencepiece (English, and the other languages), a vocab.json of their pieces less every 40th
(pieces without an id read as <unk>), the same ids (`</s>` appended) and the same decoded text.
Usage: marian_reference.py MARIAN_CHECK WORKDIR"""
import glob
import json
import os
import subprocess
import sys

import torch
import transformers as tf

F32_TOL = 1e-5
# bfloat16 keeps 8 significant bits (unit roundoff 2^-8); 2 + 2 post-LN layers round their
# activations about 15 times on the way to the logits: 0.06 of the largest logit.
BF16_TOL = 0.06
NEW = 64
BEAM_NEW = 24
V, PAD, EOS = 101, 100, 0
# eos's final_logits_bias raised by these: beams that run to the forced eos, and beams of
# which one ends at once and one runs on.
EOS_BIASES = (0.0, 2.0)


def config(**extra):
    return tf.MarianConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4,
                           encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                           activation_function="swish", scale_embedding=True, pad_token_id=PAD,
                           decoder_start_token_id=PAD, eos_token_id=EOS, forced_eos_token_id=EOS,
                           **extra)


GENERATION = dict(num_beams=4, bad_words_ids=[[PAD]], forced_eos_token_id=EOS, length_penalty=1.0,
                  early_stopping=False, max_length=BEAM_NEW + 1)


def random_model(seed, eos_bias):
    torch.manual_seed(seed)
    cfg = config()
    cfg._attn_implementation = "eager"
    model = tf.MarianMTModel(cfg).eval()
    with torch.no_grad():  # std 0.2 so that argmax margins dwarf rounding
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # the fixed sinusoids (not saved)
                continue
            if "layer_norm.weight" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.2)
        model.final_logits_bias.normal_(0, 0.2)
        model.final_logits_bias[0, EOS] += eos_bias
    return model


def save(model, d):
    model.save_pretrained(d)
    try:
        with open(f"{d}/generation_config.json") as f:
            g = json.load(f)
    except FileNotFoundError:
        g = {}
    g.update(GENERATION)
    with open(f"{d}/generation_config.json", "w") as f:
        json.dump(g, f)


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, PAD, (2, 10), generator=g)
    src[:, -1] = EOS
    src[1, 6] = EOS
    src[1, 7:] = PAD
    tgt = torch.randint(1, PAD, (2, 8), generator=g)
    tgt[:, 0] = PAD
    return src, tgt


def strip(ids):
    out = []
    for t in ids[1:]:
        if t == EOS:
            break
        out.append(t)
    return out


def reference(model, src, tgt):
    mask = (src != PAD).long()
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        y = torch.full((2, 1), PAD)
        for _ in range(NEW):  # greedy, no eos stop, no logits processors
            out = model(input_ids=src, attention_mask=mask, decoder_input_ids=y).logits
            y = torch.cat([y, out[:, -1].argmax(-1, keepdim=True)], 1)
        beams = model.generate(input_ids=src, attention_mask=mask, do_sample=False,
                               max_length=BEAM_NEW + 1,
                               **{k: v for k, v in GENERATION.items() if k != "max_length"})
    greedy = [row[1:] for row in y.tolist()]
    return logits.reshape(-1, V).float(), greedy, [strip(r) for r in beams.tolist()]


def graft(check, d, src, tgt, extra=()):
    rows = lambda t: ";".join(",".join(map(str, r)) for r in t.tolist())
    r = subprocess.run([check, d, rows(src), rows(tgt), str(NEW), *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"marian_check {d} failed: {r.stderr}")
    lines = [l.split() for l in r.stdout.splitlines()]
    logits = torch.tensor([[float(v) for v in l[1:]] for l in lines if l[0] == "logits"])
    greedy = [[int(v) for v in l[1:]] for l in lines if l[0] == "greedy"]
    beam = [[int(v) for v in l[1:BEAM_NEW + 1]] for l in lines if l[0] == "beam"]
    return logits, greedy, beam


def compare(what, got, want, tol):
    err = ((got[0] - want[0]).abs().max() / want[0].abs().max()).item()
    ok = err <= tol
    line = f"{what}: max |graft - transformers| / max |logit| = {err:.2e} (tol {tol:g})"
    if got[1] is not None:
        same_g, same_b = got[1] == want[1], got[2] == want[2]
        line += (f", {NEW} greedy tokens {'identical' if same_g else 'DIFFER'}, beam 4 "
                 f"{'identical' if same_b else 'DIFFERS'} ({[len(b) for b in want[2]]} tokens)")
        if not same_b:
            line += f"\n  graft {got[2]}\n  transformers {want[2]}"
        ok = ok and same_g and same_b
    print(line)
    return ok


def check_files(check, work, eos_bias):
    model = random_model(1, eos_bias)
    src, tgt = inputs(1)
    f32, b16 = f"{work}/marian_f32", f"{work}/marian_bf16"
    save(model, f32)
    name = f"marian (eos bias {eos_bias:g})"
    ok = compare(f"{name} float32", graft(check, f32, src, tgt), reference(model, src, tgt),
                 F32_TOL)
    model.to(torch.bfloat16)
    save(model, b16)
    wide = tf.MarianMTModel.from_pretrained(b16, dtype=torch.float32,
                                            attn_implementation="eager").eval()
    want = reference(wide, src, tgt)
    ok &= compare(f"{name} bfloat16 file widened", graft(check, b16, src, tgt, ["float32"]), want,
                  F32_TOL)
    got = graft(check, b16, src, tgt)
    ok &= compare(f"{name} bfloat16 file run in bfloat16", (got[0], None), want, BF16_TOL)
    return ok


def check_refused(check, work):
    d = f"{work}/marian_f32"
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    cfg["share_encoder_decoder_embeddings"] = False
    bad = f"{work}/unshared"
    subprocess.run(["cp", "-r", d, bad], check=True)
    with open(f"{bad}/config.json", "w") as f:
        json.dump(cfg, f)
    r = subprocess.run([check, bad, "1,0", "100,1", "2"], capture_output=True, text=True)
    print(f"share_encoder_decoder_embeddings false: exit {r.returncode}: {r.stderr.strip()}")
    return r.returncode == 2 and "share_encoder_decoder_embeddings" in r.stderr


FORTUNES = "/usr/share/games/fortunes"


def fortune_lines(paths):
    lines = []
    for p in sorted(paths):
        if p.endswith((".dat", ".u8")) or not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8", errors="ignore") as f:
            lines += [l.strip() for l in f if l.strip() and l.strip() != "%"]
    return lines


def train_spm(lines, prefix, spm):
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=prefix,
                                   vocab_size=2000, model_type="unigram", character_coverage=1.0,
                                   num_threads=2, minloglevel=2)
    os.rename(prefix + ".model", os.path.dirname(prefix) + "/" + os.path.basename(prefix) + ".spm")


def marian_vocab(d, spm):
    pieces = ["</s>", "<unk>"]
    for name in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=f"{d}/{name}.spm")
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    seen, vocab = set(), {}
    for i, p in enumerate(pieces):
        if p in seen or p in ("<s>",) or (i % 40 == 39):
            continue
        seen.add(p)
        vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    with open(f"{d}/vocab.json", "w") as f:
        json.dump(vocab, f, ensure_ascii=False)


def check_tokenizer(check, work):
    english = fortune_lines(glob.glob(f"{FORTUNES}/*"))
    others = fortune_lines(glob.glob(f"{FORTUNES}/*/*"))
    if not english or not others:
        print(f"MarianTokenizer: skipped: no fortune files under {FORTUNES} (make fortunes)")
        return True
    try:
        import sentencepiece as spm
    except ImportError:
        print("MarianTokenizer: skipped: no sentencepiece in this Python (make interop installs it)")
        return True
    d = f"{work}/tokenizer"
    os.makedirs(d)
    train_spm(english, f"{d}/source", spm)
    train_spm(others, f"{d}/target", spm)
    marian_vocab(d, spm)
    lines = english + others + [">>de<< " + english[0]]
    with open(f"{d}/lines.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    tok = tf.MarianTokenizer(f"{d}/source.spm", f"{d}/target.spm", f"{d}/vocab.json")
    r = subprocess.run([check, "--tokenize", d, f"{d}/lines.txt"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"marian_check --tokenize failed: {r.stderr}")
    out = r.stdout.split("\n")
    source = spm.SentencePieceProcessor(model_file=f"{d}/source.spm")
    piece = {i: p for p, i in tok.encoder.items()}
    score = lambda ids: sum(source.get_score(source.piece_to_id(piece[i])) for i in ids)
    bad = ties = 0
    for i, line in enumerate(lines):
        ids = tok.encode(line)
        text = tok.decode(ids, skip_special_tokens=True)
        got_ids = [int(v) for v in out[2 * i].split()[1:]]
        got_text = out[2 * i + 1][5:]
        if got_ids == ids and got_text == text:
            continue
        # Two segmentations of equal score (a Viterbi tie): libsentencepiece and Python's
        # sentencepiece of other versions may pick either; the pieces are the same text.
        if (got_text == text and sorted(got_ids) == sorted(ids)
                and abs(score(got_ids) - score(ids)) < 1e-4):
            ties += 1
            continue
        bad += 1
        if bad <= 3:
            print(f"  line {i}: {line!r}\n    graft {got_ids} {got_text!r}\n    transformers {ids} {text!r}")
    print(f"MarianTokenizer: {len(lines)} fortune lines, {bad} differ (ids or decoded text), "
          f"{ties} are the same pieces in another order of equal score (a segmentation tie)")
    return bad == 0


def main():
    check, work = sys.argv[1], sys.argv[2]
    print(f"torch {torch.__version__}, transformers {tf.__version__}")
    ok = True
    for eos_bias in EOS_BIASES:
        ok &= check_files(check, work, eos_bias)
    ok &= check_refused(check, work)
    ok &= check_tokenizer(check, work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
