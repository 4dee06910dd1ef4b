#!/usr/bin/env bash
# Bad inputs, as a new user and a hostile file would give them, against the four programs: each
# must end with the expected exit code (2 for a usage or input error, never a signal) and one
# clear line on stderr containing the expected words. A ctest test (bad_inputs) runs it; with
# --markdown it prints the README's table of inputs and the exact messages.
#   tests/bad_inputs.sh BUILD_DIR [--markdown]
set -uo pipefail
BUILD=$(cd "$1" && pwd)
MARKDOWN=${2:-}
T=$BUILD/examples/translation/translate
LM=$BUILD/examples/lm/lm
CL=$BUILD/examples/classify/classify
EM=$BUILD/examples/embed/embed
W=$(mktemp -d "${TMPDIR:-/tmp}/graft_bad_inputs.XXXXXX")
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
failures=0

# case KIND DESCRIPTION EXPECTED_RC EXPECTED_WORDS -- COMMAND...  (stdin from $STDIN if set)
case_() {
  local kind=$1 what=$2 want_rc=$3 want=$4
  shift 5
  local out err rc
  if [[ -n ${STDIN:-} ]]; then
    "$@" <"$STDIN" >"$W/out" 2>"$W/err"
  else
    "$@" </dev/null >"$W/out" 2>"$W/err"
  fi
  rc=$?
  err=$(grep -v '^\(train.tsv\|valid.tsv\|trained SentencePiece\|model:\|step \)' "$W/err" | tail -n 1)
  [[ -z $err ]] && err=$(head -c 200 "$W/out" | tr '\n' '|')
  if [[ -n $MARKDOWN ]]; then
    printf '| %s | %s | %s | `%s` |\n' "$kind" "$what" "$rc" "${err//|/\\|}"
  fi
  if [[ $rc -ne $want_rc || $err != *"$want"* ]]; then
    echo "FAIL: $kind / $what: exit $rc (want $want_rc), message: $err (want: $want)" >&2
    failures=$((failures + 1))
  fi
}

# A small corpus and a trained run to damage copies of.
"$T" generate-data --out "$W/data" --seed 1 --train 300 --valid 30 --test 10 >/dev/null
"$T" train --data "$W/data" --out "$W/run" --steps 2 --vocab 100 --valid-every 2 >/dev/null 2>&1 ||
  { echo "bad_inputs: could not train the reference run" >&2; exit 1; }
fresh() { rm -rf "$W/r" && cp -r "$W/run" "$W/r"; }
[[ -n $MARKDOWN ]] && printf '| kind | input | exit | message |\n|---|---|---:|---|\n'

D=$W/data
case_ CLI "no subcommand" 2 "a subcommand is required" -- "$T"
case_ CLI "unknown subcommand \`translate trian\`" 2 "unknown subcommand 'trian'" -- "$T" trian
case_ CLI "\`--seed -1\`" 2 "--seed: Value -1 not in range" -- "$T" train --data "$D" --out "$W/x" --steps 5 --seed -1
case_ CLI "\`--steps 99999999999999999999\`" 2 "--steps: Value" -- "$T" train --data "$D" --out "$W/x" --steps 99999999999999999999
case_ CLI "\`--lr nan\`" 2 "--lr: Value nan is not a number" -- "$T" train --data "$D" --out "$W/x" --steps 5 --lr nan
case_ CLI "\`--lr -1\`" 2 "--lr: Value -1 not in range" -- "$T" train --data "$D" --out "$W/x" --steps 5 --lr -1
case_ CLI "\`--schedule linear\`" 2 "--schedule: linear not in {auto,noam,cosine,constant}" -- "$T" train --data "$D" --out "$W/x" --steps 5 --schedule linear
case_ CLI "\`--schedule cosine\` without \`--lr\`" 2 "schedule cosine needs lr > 0" -- "$T" train --data "$D" --out "$W/x" --steps 5 --schedule cosine
case_ CLI "\`--schedule cosine\` with \`--minutes\`" 2 "cosine decays over the step budget: give steps" -- "$T" train --data "$D" --out "$W/x" --minutes 1 --schedule cosine --lr 1e-3
case_ CLI "\`--optimizer sgd\`" 2 "--optimizer: sgd not in {adam,adamw}" -- "$LM" train --out "$W/x" --steps 5 --optimizer sgd
case_ CLI "\`--minutes nan\`" 2 "--minutes: Value nan is not a number" -- "$T" train --data "$D" --out "$W/x" --minutes nan
case_ CLI "\`--vocab 2147483000\`" 2 "--vocab: Value 2147483000 not in range" -- "$T" train --data "$D" --out "$W/x" --steps 5 --vocab 2147483000
case_ CLI "\`--preset huge\`" 2 "unknown preset 'huge'" -- "$T" train --data "$D" --out "$W/x" --steps 5 --preset huge
case_ CLI "\`--positions absolute\`" 2 "--positions" -- "$T" train --data "$D" --out "$W/x" --steps 5 --positions absolute
case_ CLI "\`--beam 0\`" 2 "--beam: Value 0 not in range" -- "$T" translate --run "$W/run" --beam 0
case_ CLI "\`--temperature 0\` when sampling" 2 "temperature" -- "$T" translate --run "$W/run" --sample --temperature 0
case_ CLI "lm \`--max-new -3\`" 2 "--max-new" -- "$LM" generate --run "$W/nothing" --max-new -3
case_ CLI "\`--precision fp16\`" 2 "--precision: fp16 not in {fp32,bf16}" -- "$T" train --data "$D" --out "$W/x" --steps 5 --precision fp16
case_ CLI "\`--precision bf16\` where oneDNN has no native bf16 kernel (here: oneDNN capped at AVX-512 without AVX512_BF16)" 2 "no native bf16 matmul kernel" -- env DNNL_MAX_CPU_ISA=AVX512_CORE "$T" train --data "$D" --out "$W/x" --steps 5 --precision bf16
case_ CLI "\`--stop-at-bleu nan\` (CLI11's range check lets NaN through)" 2 "--stop-at-bleu: Value nan is not a number" -- "$T" train --data "$D" --out "$W/x" --steps 5 --stop-at-bleu nan
case_ CLI "lm \`--dropout nan\`" 2 "--dropout: Value nan is not a number" -- "$LM" train --out "$W/lm" --steps 2 --dropout nan
case_ CLI "classify \`--dropout nan\`" 2 "--dropout: Value nan is not a number" -- "$CL" train --data "$D" --out "$W/cl" --steps 2 --dropout nan
case_ CLI "\`--temperature nan\` when sampling" 2 "--temperature: Value nan is not a number" -- "$T" translate --run "$W/run" --sample --temperature nan
case_ CLI "\`--stop-at-bleu 101\`" 2 "--stop-at-bleu: Value 101 not in range" -- "$T" train --data "$D" --out "$W/x" --steps 5 --stop-at-bleu 101
case_ CLI "\`--graph step.txt\`" 2 "graph: 'step.txt': the file name must end in .dot, .svg, .png or .pdf" -- "$T" train --data "$D" --out "$W/x" --steps 5 --graph step.txt
case_ CLI "\`--dump-batches\` with \`--resume\`" 2 "--dump-batches records a whole run from step 0; not with --resume" -- "$T" train --data "$D" --out "$W/run" --steps 5 --resume --dump-batches "$W/dump.jsonl"
printf '5 6 7\n' >"$W/one.ids"
printf '5 x 7\n' >"$W/bad.ids"
printf '5 999999\n' >"$W/big.ids"
case_ CLI "score: ids that are not numbers" 2 "line 1 is not ids" -- "$T" score --run "$W/run" --data "$D/valid.tsv" --hyp-ids "$W/bad.ids"
case_ CLI "score: an id outside the vocabulary" 2 "id 999999 outside the vocabulary" -- "$T" score --run "$W/run" --data "$D/valid.tsv" --hyp-ids "$W/big.ids"
case_ CLI "score: no such ids file" 2 "score: cannot open '$W/none.ids'" -- "$T" score --run "$W/run" --data "$D/valid.tsv" --hyp-ids "$W/none.ids"
case_ CLI "score: \`--hyp-ids /dev/zero\`" 2 "score: '/dev/zero' is not a regular file" -- timeout 20 "$T" score --run "$W/run" --data "$D/valid.tsv" --hyp-ids /dev/zero
case_ CLI "classify, a run that does not exist" 2 "load_json: '$W/nothing/config.json': cannot open" -- "$CL" evaluate --run "$W/nothing" --data "$D/test.tsv"

mkdir -p "$W/empty" && : >"$W/empty/train.tsv" && : >"$W/empty/valid.tsv"
case_ corpus "no such directory" 2 "read_tsv: cannot open '$W/none/train.tsv'" -- "$T" train --data "$W/none" --out "$W/x" --steps 5
case_ corpus "empty train.tsv" 2 "no usable sentence pairs in '$W/empty/train.tsv'" -- "$T" train --data "$W/empty" --out "$W/x" --steps 5
mkdir -p "$W/zero" && ln -s /dev/zero "$W/zero/train.tsv" && cp "$D/valid.tsv" "$W/zero/valid.tsv"
case_ corpus "train.tsv a symbolic link to /dev/zero (once read forever)" 2 "train.tsv' is not a regular file" -- timeout 20 "$T" train --data "$W/zero" --out "$W/x" --steps 5
mkdir -p "$W/long"
python3 - "$W/long" <<'EOF'
import random, sys
random.seed(1)
for split in ("train", "valid"):
    with open(f"{sys.argv[1]}/{split}.tsv", "w") as f:
        for _ in range(40):
            a = "".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(450))
            b = "".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(450))
            f.write(f"{a}\t{b}\n")
EOF
case_ corpus "every pair longer than the model's max_len" 2 "fits the model (255 tokens a side" -- "$T" train --data "$W/long" --out "$W/x" --steps 5 --vocab 40
mkdir -p "$W/bin" && head -c 3000000 /dev/urandom | tr -d '\n' >"$W/bin/train.tsv" && cp "$W/bin/train.tsv" "$W/bin/valid.tsv"
case_ corpus "3 MB of random bytes, no newline" 2 "no usable sentence pairs" -- "$T" train --data "$W/bin" --out "$W/x" --steps 5

fresh; head -c 1000 "$W/run/model.safetensors" >"$W/r/model.safetensors"
case_ checkpoint "model.safetensors truncated" 2 "is larger than the" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; python3 -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-5]^=1; open(p,'wb').write(b)" "$W/r/model.safetensors"
case_ checkpoint "one flipped bit in the tensor data" 2 "checksum mismatch" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; python3 -c "
import struct,sys; h=b'['*100000+b']'*100000; open(sys.argv[1],'wb').write(struct.pack('<Q',len(h))+h)" "$W/r/model.safetensors"
case_ checkpoint "header nested 100,000 levels deep" 2 "nested more than 3 levels deep" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; python3 -c "
import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<Q',2**62)+b'{}')" "$W/r/model.safetensors"
case_ checkpoint "header length 2^62" 2 "exceeds the limit" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; head -c 3000 "$W/run/train_state.safetensors" >"$W/r/train_state.safetensors"
case_ checkpoint "train_state.safetensors truncated, --resume" 2 "truncated or corrupted" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; rm "$W/r/checkpoint/train_state.safetensors"
case_ checkpoint "--resume without a train state" 2 "nothing to resume" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
case_ checkpoint "forward: a batch file without \"src\"" 2 "no tensor 'src' in '$W/run/model.safetensors'" -- "$T" forward --run "$W/run" --batch "$W/run/model.safetensors" --out "$W/fw.safetensors"
case_ checkpoint "import-weights: a train state instead of weights" 2 "they do not belong together" -- "$T" import-weights --run "$W/r" --weights "$W/run/train_state.safetensors"

fresh; sed -i 's/"heads": 4/"heads": 8/' "$W/r/config.json"
case_ config "heads edited in config.json" 2 "config.json' does not match the weights" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; sed -i 's/"heads": 4/"heads": 8/' "$W/r/config.json"
case_ config "heads edited in config.json, --resume" 2 "config.json' is not the file the interrupted run started with" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; sed -i 's/"enc_layers": 2/"enc_layers": 1000000000/' "$W/r/config.json"
case_ config "enc_layers 10^9, --resume" 2 "field \"enc_layers\" must be in [1, 1024]" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; sed -i 's/"max_len": 256/"max_len": 3000000/' "$W/r/config.json"
case_ config "max_len 3·10^6, import-weights (once a 4.5 GB sinusoid table)" 2 "field \"max_len\" must be in [1, 65536], got 3000000" -- "$T" import-weights --run "$W/r" --weights "$W/run/model.safetensors"
fresh; sed -i 's/"d_ff": 512/"d_ff": 16000000/' "$W/r/config.json"
case_ config "d_ff 1.6·10^7 (8·10^9 parameters), --resume" 2 "the config describes a model of" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; sed -i 's/"eos_id": 3/"eos_id": 99999/' "$W/r/config.json"
case_ config "eos_id outside the vocabulary, --resume" 2 "field \"eos_id\" must be a token id" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; sed -i 's/"d_ff": 512/"d_ff": 512.5/' "$W/r/config.json"
case_ config "a size that is not an integer, --resume" 2 "field \"d_ff\" must be an integer, got 512.5" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; sed -i 's/"dtype": "float32"/"dtype": "int8"/' "$W/r/config.json"
case_ config "dtype int8, --resume" 2 "field \"dtype\" must be float32, float64, bfloat16 or float16" -- "$T" train --data "$D" --out "$W/r" --steps 4 --resume
fresh; printf '{"model": {' >"$W/r/config.json"
case_ config "config.json cut short" 2 "config.json': parse error at line 1" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; python3 -c "import sys; open(sys.argv[1],'w').write('['*100+']'*100)" "$W/r/config.json"
case_ config "config.json nested 100 levels" 2 "nested more than 32 levels" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"

"$T" train --data "$D" --out "$W/other" --steps 2 --vocab 90 --seed 2 >/dev/null 2>&1 ||
  { echo "bad_inputs: could not train the second reference run" >&2; exit 1; }
fresh; cp "$W/other/spm.model" "$W/r/spm.model"
case_ tokenizer "spm.model of another run" 2 "spm.model' does not match the weights" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"

printf '\n   \nthe dog runs .\n' >"$W/stdin"
STDIN=$W/stdin case_ input "empty and blank lines on stdin" 0 "||" -- "$T" translate --run "$W/run"
python3 -c "import sys; open(sys.argv[1],'w').write('the dog '*150000+'\n')" "$W/stdin"
STDIN=$W/stdin case_ input "a 1.2 MB line on stdin" 0 "over 1048576 bytes were not translated" -- "$T" translate --run "$W/run"
python3 -c "import sys; open(sys.argv[1],'w').write('the dog '*400+'\n')" "$W/stdin"
STDIN=$W/stdin case_ input "a line longer than max_len" 0 "were truncated" -- "$T" translate --run "$W/run"

case_ lm "a text file that does not exist" 2 "cannot read '$W/none.txt'" -- "$LM" train --out "$W/lm" --text "$W/none.txt" --steps 2
printf 'one paragraph only\n' >"$W/one.txt"
case_ lm "a text with one document" 2 "need at least 2 documents" -- "$LM" train --out "$W/lm" --text "$W/one.txt" --steps 2
head -c 5000 /dev/urandom >"$W/bin.txt"
case_ lm "\`--text /dev/zero\`" 2 "'/dev/zero' is not a regular file" -- timeout 20 "$LM" train --out "$W/lm" --text /dev/zero --steps 2
case_ lm "a binary file as text" 2 "is not UTF-8 text" -- "$LM" train --out "$W/lm" --text "$W/bin.txt" --steps 2
python3 -c "import sys; open(sys.argv[1],'w').write(''.join(f'a rolling stone {i} gathers no moss\n%\n' for i in range(60)))" "$W/moss.txt"
"$LM" train --out "$W/lmrun" --text "$W/moss.txt" --steps 2 --context 16 --valid-every 2 >/dev/null 2>&1 ||
  { echo "bad_inputs: could not train the reference lm run" >&2; exit 1; }
case_ lm "evaluate --text: any text, scored" 0 "text (context 16): loss" -- "$LM" evaluate --run "$W/lmrun" --text "$W/moss.txt"
printf 'short\n' >"$W/short.txt"
case_ lm "evaluate --text: a text shorter than one window" 2 "the text is shorter than one window of 16 tokens" -- "$LM" evaluate --run "$W/lmrun" --text "$W/short.txt"
case_ lm "evaluate --text: no such file" 2 "--text: File does not exist" -- "$LM" evaluate --run "$W/lmrun" --text "$W/none.txt"
mkdir -p "$W/tsv" && printf 'en\thello there\nno tab here\n' >"$W/tsv/train.tsv" && cp "$W/tsv/train.tsv" "$W/tsv/valid.tsv"
case_ classify "a TSV line without a tab" 2 "train.tsv' line 2: expected label<TAB>text" -- "$CL" train --data "$W/tsv" --out "$W/cl" --steps 2
printf 'en\thello \xff\xfe there\n' >"$W/tsv/train.tsv"
case_ classify "a TSV line that is not UTF-8" 2 "line 1: not UTF-8 text" -- "$CL" train --data "$W/tsv" --out "$W/cl" --steps 2
mkdir -p "$W/zerotsv" && ln -s /dev/zero "$W/zerotsv/train.tsv" && ln -s /dev/zero "$W/zerotsv/valid.tsv"
case_ classify "train.tsv a symbolic link to /dev/zero" 2 "train.tsv' is not a regular file" -- timeout 20 "$CL" train --data "$W/zerotsv" --out "$W/cl" --steps 2
mkdir -p "$W/labels" && seq 100000 | sed 's/$/\tsome text/' >"$W/labels/train.tsv" && cp "$W/labels/train.tsv" "$W/labels/valid.tsv"
case_ classify "100,000 distinct labels (once past 90 s before step 1)" 2 "train.tsv' has more than 1024 distinct labels" -- timeout 20 "$CL" train --data "$W/labels" --out "$W/cl" --steps 2
printf 'en\thello there\nde\tguten Tag\n' >"$W/tsv/train.tsv" && cp "$W/tsv/train.tsv" "$W/tsv/valid.tsv"
case_ classify "--ngram-max outside [2, 8]" 2 "--ngram-max: Value 9 not in range 2 to 8" -- "$CL" train --data "$W/tsv" --out "$W/cl" --steps 2 --ngram-max 9
"$CL" train --data "$W/tsv" --out "$W/clrun" --steps 2 --valid-every 2 --ngram-buckets 1024 >/dev/null 2>&1 ||
  { echo "bad_inputs: could not train the reference classify run" >&2; exit 1; }
case_ classify "evaluate: a --baseline-train file that does not exist" 2 "cannot read '$W/none.tsv'" -- \
  "$CL" evaluate --run "$W/clrun" --data "$W/tsv/valid.tsv" --baseline-train "$W/none.tsv"
mv "$W/tsv/train.tsv" "$W/tsv/train.moved"
case_ classify "evaluate: the run's train.tsv moved (baseline skipped)" 0 "baseline: skipped (no file" -- \
  "$CL" evaluate --run "$W/clrun" --data "$W/tsv/valid.tsv"

# embed, on a tiny random BERT in Hugging Face's layout (tests/tiny_bert.py), damaged copy by copy.
python3 "$(dirname "$0")/tiny_bert.py" "$W/bert"
printf 'the cat sat\na cat.\n' >"$W/lines.txt"
bert() { rm -rf "$W/b" && cp -r "$W/bert" "$W/b"; }
case_ embed "\`--model\` a directory that does not exist" 2 "--model '$W/none' is not a directory" -- "$EM" similarity --model "$W/none" a b
bert && sed -i 's/"model_type": "bert"/"model_type": "gpt2"/' "$W/b/config.json"
case_ embed "config.json of an unsupported architecture (model_type gpt2)" 2 "the architecture (model_type \"gpt2\") is not supported" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/e.st"
bert && sed -i 's/"hidden_size": 8/"hidden_size": 12/' "$W/b/config.json"
case_ embed "config.json whose hidden_size differs from the weights" 2 "has shape (11, 8), the config needs (11, 12)" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/e.st"
bert && truncate -s -64 "$W/b/model.safetensors"
case_ embed "a truncated model.safetensors" 2 "is past the end of the" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/e.st"
bert && rm "$W/b/model.safetensors"
case_ embed "no model.safetensors (a PyTorch .bin only)" 2 "bin_to_safetensors.py" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/e.st"
bert && sed -i '/^\[UNK\]$/d' "$W/b/vocab.txt"
case_ embed "a vocab.txt without [UNK]" 2 "the vocabulary has no unknown token \"[UNK]\"" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/e.st"
bert && printf '{"model": {"type": "BPE", "vocab": {}, "merges": []}}' >"$W/b/tokenizer.json"
case_ embed "a tokenizer.json of another model (BPE)" 2 "BPE" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/e.st"
printf 'the cat\n\xff\xfe sat\n' >"$W/badlines.txt"
case_ embed "a collection line that is not UTF-8" 2 "line 2 is not valid UTF-8" -- "$EM" search --model "$W/bert" --collection "$W/badlines.txt" --query cat
case_ embed "\`--collection /dev/zero\`" 2 "'/dev/zero' is not a regular file" -- timeout 20 "$EM" search --model "$W/bert" --collection /dev/zero --query cat
"$EM" search --model "$W/bert" --collection "$W/lines.txt" --query cat >/dev/null 2>&1
printf 'the cat sat\na cat sat.\n' >"$W/lines.txt"
case_ embed "search: the collection edited since its index was built" 0 "embed: rebuilt the index" -- "$EM" search --model "$W/bert" --collection "$W/lines.txt" --query cat
mv "$W/tsv/train.moved" "$W/tsv/train.tsv"
case_ classify "train --init-from a directory without config.json" 2 "config.json" -- "$CL" train --data "$W/tsv" --out "$W/clp" --steps 2 --init-from "$W/none"
# The index is tied to every model file that changes an embedding, not only the weights.
bert && "$EM" search --model "$W/b" --collection "$W/lines.txt" --query cat >/dev/null 2>&1
mkdir -p "$W/b/1_Pooling" && echo '{"pooling_mode_cls_token": true}' >"$W/b/1_Pooling/config.json"
case_ embed "search: a pooling config added since the index was built" 0 "1_Pooling/config.json' was added since it was built" -- "$EM" search --model "$W/b" --collection "$W/lines.txt" --query cat
sed -i 's/^cat$/dog/' "$W/b/vocab.txt"
case_ embed "search: vocab.txt edited since the index was built" 0 "vocab.txt' was edited since it was built" -- "$EM" search --model "$W/b" --collection "$W/lines.txt" --query cat

# Outputs checked: a model that loads (checksum and all) but holds a NaN weight (tests/nan_weight
# fills one through the library) makes every score, loss and embedding command fail naming the
# output, the weight and the first op it reached, leaving no output file behind.
NW=$BUILD/tests/nan_weight
absent() { [[ -e $1 ]] && { echo "FAIL: $2 left '$1' behind" >&2; failures=$((failures + 1)); }; }
cp -r "$W/clrun" "$W/clnan" && "$NW" "$W/clnan/model.safetensors" head.weight
printf 'hello there\n' >"$W/stdin"
STDIN=$W/stdin case_ output "classify predict, a NaN weight (once printed \`nan\`, exit 0)" 2 "stdin line 1: predict: the output for 'hello there' holds NaN: the model's parameter 'head.weight'" -- "$CL" predict --run "$W/clnan"
case_ output "classify evaluate, a NaN weight" 2 "evaluate: the output for examples 1..2 holds NaN: the model's parameter 'head.weight'" -- "$CL" evaluate --run "$W/clnan" --data "$W/tsv/valid.tsv" --confusion "$W/cm.png"
absent "$W/cm.png" "classify evaluate with a NaN weight"
cp -r "$W/lmrun" "$W/lmnan" && "$NW" "$W/lmnan/model.safetensors" embedding.weight
case_ output "lm evaluate, a NaN weight" 2 "is NaN: the model's parameter 'embedding.weight'" -- "$LM" evaluate --run "$W/lmnan" --text "$W/moss.txt"
bert && "$NW" "$W/b/model.safetensors" embeddings.word_embeddings.weight
case_ output "embed encode, a NaN weight" 2 "the embedding of '$W/lines.txt' line 1 holds NaN: the model's parameter 'word.weight'" -- "$EM" encode --model "$W/b" --in "$W/lines.txt" --out "$W/nan.st"
absent "$W/nan.st" "embed encode with a NaN weight"
case_ output "embed similarity, a NaN weight" 2 "the embedding of text 1 holds NaN: the model's parameter 'word.weight'" -- "$EM" similarity --model "$W/b" a b
case_ output "embed search, a NaN weight" 2 "search: the model's parameter 'word.weight' (f32 (11, 8)) holds NaN" -- "$EM" search --model "$W/b" --collection "$W/lines.txt" --index "$W/nan.index" --query cat
absent "$W/nan.index" "embed search with a NaN weight"
fresh; "$NW" "$W/r/model.safetensors" embedding.weight
case_ output "translate evaluate, a NaN weight" 2 "evaluate: the model's parameter 'embedding.weight'" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
python3 -c '
import json, struct, sys
header, data = {}, b""
for name, row in (("src", [5, 6, 7, 3]), ("tgt_in", [2, 5, 6]), ("tgt_out", [5, 6, 3])):
    b = struct.pack("<%dq" % len(row), *row)
    header[name] = {"dtype": "I64", "shape": [1, len(row)], "data_offsets": [len(data), len(data) + len(b)]}
    data += b
h = json.dumps(header).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)' "$W/batch.st"
case_ output "translate forward, a NaN weight" 2 "forward: the logits holds NaN: the model's parameter 'embedding.weight'" -- "$T" forward --run "$W/r" --batch "$W/batch.st" --out "$W/fw.st"
absent "$W/fw.st" "translate forward with a NaN weight"

# Output paths: a FIFO, a directory or an input of the same command is refused by name before
# any work (a device too: `--out /dev/full` as root once replaced the device with a file; not
# tried here, where a regression would replace it).
mkfifo "$W/fifo"
case_ output "embed encode \`--out\` a FIFO" 2 "encode --out: '$W/fifo' is a FIFO (named pipe), not a file to write" -- timeout 20 "$EM" encode --model "$W/bert" --in "$W/lines.txt" --out "$W/fifo"
case_ output "embed encode \`--out\` a directory" 2 "encode --out: '$W' is a directory, not a file to write" -- "$EM" encode --model "$W/bert" --in "$W/lines.txt" --out "$W"
case_ output "embed search \`--index\` naming the collection (once overwrote it)" 2 "search --index: '$W/lines.txt' is the same file as --collection" -- "$EM" search --model "$W/bert" --collection "$W/lines.txt" --index "$W/lines.txt" --query cat
case_ output "embed search \`--index\` naming the model's weights" 2 "is the same file as the model's model.safetensors" -- "$EM" search --model "$W/bert" --collection "$W/lines.txt" --index "$W/bert/model.safetensors" --query cat
case_ output "classify evaluate \`--confusion\` a FIFO" 2 "--confusion: '$W/fifo' is a FIFO (named pipe), not a file to write" -- timeout 20 "$CL" evaluate --run "$W/clrun" --data "$W/tsv/valid.tsv" --confusion "$W/fifo"
case_ output "translate forward \`--out\` naming its \`--batch\`" 2 "forward --out: '$W/batch.st' is the same file as --batch" -- "$T" forward --run "$W/run" --batch "$W/batch.st" --out "$W/batch.st"
case_ output "translate \`--attention\` naming the run's weights" 2 "--attention: '$W/run/model.safetensors' is the same file as the run's model.safetensors" -- "$T" translate --run "$W/run" --attention "$W/run/model.safetensors"
fresh; rm "$W/r/model.safetensors" && mkdir "$W/r/model.safetensors"
case_ output "import-weights into a run whose model.safetensors is a directory" 2 "import-weights: '$W/r/model.safetensors' is a directory, not a file to write" -- "$T" import-weights --run "$W/r" --weights "$W/run/model.safetensors"

# Stdin read with a cap per line, in bounded memory: 20 MB of zero bytes without a newline (as
# `< /dev/zero` gives; it once grew until the OOM killer) is one line over the cap.
head -c 20000000 /dev/zero >"$W/zeros"
STDIN=$W/zeros case_ input "classify predict < 20 MB of zero bytes, no newline" 0 "classify: 1 input line(s) over 65536 bytes were not classified (empty output lines)" -- "$CL" predict --run "$W/clrun"
STDIN=$W/zeros case_ input "embed search < 20 MB of zero bytes, no newline" 2 "search: stdin line 1 is over 1048576 bytes" -- "$EM" search --model "$W/bert" --collection "$W/lines.txt"
STDIN=$W/zeros case_ input "embed tokenize < 20 MB of zero bytes, no newline" 2 "tokenize: stdin line 1 is over 1048576 bytes" -- "$EM" tokenize --model "$W/bert"

case_ CLI "\`--collective-timeout nan\` (once SIGABRT)" 2 "--collective-timeout: Value nan is not a number" -- "$LM" train --out "$W/x" --steps 2 --collective-timeout nan
case_ CLI "\`--collective-timeout 1e10\` (once overflowed the watchdog's deadline)" 2 "--collective-timeout: Value 1e10 not in range" -- "$T" train --data "$D" --out "$W/x" --steps 2 --collective-timeout 1e10
mkdir -p "$W/graph.svg"
case_ translate "\`train --graph\` naming a directory" 2 "graph: '$W/graph.svg' is a directory, not a file to write" -- "$T" train --data "$D" --out "$W/x" --steps 2 --vocab 100 --graph "$W/graph.svg"
case_ translate "\`train --dump-batches\` naming its own train.tsv" 2 "--dump-batches: '$D/train.tsv' is the same file as --data's train.tsv" -- "$T" train --data "$D" --out "$W/x" --steps 2 --vocab 100 --dump-batches "$D/train.tsv"
case_ translate "a second training into a run another process writes (flock holds writer.lock)" 2 "run directory '$W/run' is being written by another process" -- flock "$W/run/writer.lock" "$T" train --data "$D" --out "$W/run" --steps 4 --vocab 100 --valid-every 2 --resume
case_ CLI "\`--dtype bf17\`" 2 "--dtype: unknown dtype 'bf17' (f32, bf16, f16 or f64" -- "$T" train --data "$D" --out "$W/x" --steps 5 --dtype bf17
case_ CLI "\`--dtype i64\`" 2 "--dtype: 'i64' is an integer dtype; the weights must be f32, f64, bf16 or f16" -- "$T" train --data "$D" --out "$W/x" --steps 5 --dtype i64

# safetensors dtypes (issue 49): st_dtype FILE DTYPE [zeros] relabels the file's first tensor as
# DTYPE (its bytes kept), or with "zeros" gives it DTYPE's byte count of zeros (offsets redone).
st_dtype() {
  python3 - "$@" <<'PY'
import json, struct, sys
path, dtype, zeros = sys.argv[1], sys.argv[2], len(sys.argv) > 3
b = open(path, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
data, out, at = b[8 + n:], b"", 0
for k in names:
    chunk = data[h[k]["data_offsets"][0]:h[k]["data_offsets"][1]]
    if k == names[0]:
        h[k]["dtype"] = dtype
        if zeros:
            count = 1
            for d in h[k]["shape"]:
                count *= d
            chunk = bytes(count * {"I8": 1, "F16": 2, "BF16": 2}[dtype])
    h[k]["data_offsets"] = [at, at + len(chunk)]
    out, at = out + chunk, at + len(chunk)
t = json.dumps(h).encode()
open(path, "wb").write(struct.pack("<Q", len(t)) + t + out)
PY
}
fresh; st_dtype "$W/r/model.safetensors" BOOL
case_ checkpoint "a tensor of a dtype graft does not store (BOOL)" 2 "unsupported dtype 'BOOL' (supported: F32, F64, I64, BF16, F16, I8)" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
fresh; st_dtype "$W/r/model.safetensors" F16
case_ checkpoint "a float32 tensor relabelled F16 (twice the bytes its shape needs)" 2 "of F16 needs" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv"
cp "$W/run/model.safetensors" "$W/i8.safetensors" && st_dtype "$W/i8.safetensors" I8 zeros
fresh; case_ checkpoint "import-weights: an I8 tensor for a float parameter" 2 "only float dtypes convert into each other on load" -- "$T" import-weights --run "$W/r" --weights "$W/i8.safetensors"
case_ CLI "\`translate export --precision fp32\` (model.safetensors is the float32 form)" 2 "--precision: fp32 not in {int8,bf16}" -- "$T" export --run "$W/run" --precision fp32
fresh; mkdir "$W/r/model.int8.safetensors"
case_ output "\`translate export\` into a run whose model.int8.safetensors is a directory" 2 "export: '$W/r/model.int8.safetensors' is a directory, not a file to write" -- "$T" export --run "$W/r" --precision int8
# The two int8 export loads below: int8 inference runs on every CPU (oneDNN's VNNI kernel, else
# graft's integer loop).
fresh; "$T" export --run "$W/r" --precision bf16 >/dev/null && cp "$W/r/model.bf16.safetensors" "$W/r/model.int8.safetensors"
case_ checkpoint "an int8 export that is a bf16 one (evaluate \`--precision int8\` loads it)" 2 "model.int8.safetensors': not an int8 export (its format is 'graft-export', precision 'bf16')" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv" --precision int8
fresh; "$T" export --run "$W/r" --precision int8 >/dev/null && st_dtype "$W/r/model.int8.safetensors" F16
case_ checkpoint "an int8 export with a tensor relabelled F16" 2 "model.int8.safetensors'" -- "$T" evaluate --run "$W/r" --data "$D/test.tsv" --precision int8

case_ CLI "\`lm generate --repetition-penalty 0\`" 2 "repetition_penalty must be a finite number > 0 (1: off), got 0" -- "$LM" generate --run "$W/lmrun" --repetition-penalty 0
case_ CLI "\`lm generate --repetition-penalty nan\`" 2 "repetition_penalty must be a finite number > 0 (1: off), got nan" -- "$LM" generate --run "$W/lmrun" --repetition-penalty nan
case_ CLI "\`lm generate --stop-id 300\` (outside the vocabulary)" 2 "stop id 300 is outside the vocabulary [0, 259)" -- "$LM" generate --run "$W/lmrun" --stop-id 300
case_ CLI "\`lm generate --min-new-tokens 50 --max-new 10\`" 2 "min_new_tokens must be in [0, max_len 10], got 50" -- "$LM" generate --run "$W/lmrun" --min-new-tokens 50 --max-new 10
mkdir -p "$W/hf_empty"
case_ CLI "\`lm generate --hf DIR\` without config.json" 2 "hf_empty/config.json': cannot open: No such file or directory" -- "$LM" generate --hf "$W/hf_empty" --ids 1
case_ CLI "\`lm generate --hf DIR --run RUN\`" 2 "--run excludes --hf" -- "$LM" generate --hf "$W/hf_empty" --run "$W/lmrun" --ids 1
case_ input "\`lm generate --hf DIR --prompt\` without tokenizer.json or tokenizer.model" 2 "neither tokenizer.json (a byte-level BPE) nor tokenizer.model (SentencePiece) loads" -- "$LM" generate --hf "$W/hf_empty" --prompt "Hi"
mkdir -p "$W/hf_spm" && echo 'not a model' >"$W/hf_spm/tokenizer.model"
case_ input "\`lm generate --hf DIR --prompt\` with a tokenizer.model that is not SentencePiece's" 2 "hf_spm/tokenizer.model' is not a SentencePiece model" -- "$LM" generate --hf "$W/hf_spm" --prompt "Hi"
case_ CLI "\`translate translate\` with neither \`--run\` nor \`--hf\`" 2 "give one of --run and --hf" -- "$T" translate
case_ CLI "\`translate translate --hf DIR --run DIR\`" 2 "--run excludes --hf" -- "$T" translate --hf "$W" --run "$W/run"
case_ CLI "\`translate translate --hf DIR --attention a.png\`" 2 "--attention needs --run (not --hf)" -- "$T" translate --hf "$W" --attention "$W/a.png"
mkdir -p "$W/hfm"
case_ input "\`translate --hf\` a directory without config.json" 2 "config.json': cannot open" -- "$T" translate --hf "$W/hfm"
echo '{"model_type": "bart"}' >"$W/hfm/config.json"
case_ input "\`translate --hf\` a config.json of another model_type" 2 'field "model_type" "bart" is not marian' -- "$T" translate --hf "$W/hfm"
echo '{"model_type": "marian", "share_encoder_decoder_embeddings": false}' >"$W/hfm/config.json"
case_ input "\`translate --hf\` a Marian config with a separate decoder vocabulary" 2 'field "share_encoder_decoder_embeddings" is false' -- "$T" translate --hf "$W/hfm"
if [[ $failures -gt 0 ]]; then
  echo "bad_inputs: $failures case(s) failed" >&2
  exit 1
fi
[[ -z $MARKDOWN ]] && echo "bad_inputs: every case gave its expected exit code and message"
exit 0
