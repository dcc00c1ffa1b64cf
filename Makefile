# Every target sets up .venv first, so a fresh clone needs nothing installed by hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# make test's worker processes (pytest-xdist, one test file per worker at a time);
# JOBS=0 runs the suite in one process.
JOBS   ?= 2

.PHONY: install test test-real test-browser browser screenshots run lint zoo slow bench bench-memory bench-docs docs-check clean golden matrix matrix-zoo hf-coverage timm-coverage

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# A plain resolution of torch + torchvision from the registry: never pin the
	# local CPU-only torch build, its torchvision ops do not load.
	$(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser and not real" -n $(JOBS) --dist loadfile --ignore=tests/real

# Published packages (the `real` extra: Lightning, diffusers, timm, PyG, whisper, SAM, ...)
# installed from the registry and run from the command line as their users would
# (tests/real/). A package that cannot be installed or imported fails the tier.
REAL_STAMP := $(VENV)/.real-installed

$(REAL_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -e '.[dev,real]'
	touch $(REAL_STAMP)

test-real: $(REAL_STAMP)
	HOOKCLI_REQUIRE_REAL=1 $(BIN)/python -m pytest -q -m real -n $(JOBS) --dist loadfile tests/real

# The html pages in a real browser: Debian's chromium (installed here when missing and we are
# root), driven by Playwright from the `browser` extra; Playwright never downloads a browser.
BROWSER_STAMP := $(VENV)/.browser-installed

$(BROWSER_STAMP): $(STAMP) pyproject.toml
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pip install -e '.[dev,browser]'
	touch $(BROWSER_STAMP)

browser: $(BROWSER_STAMP)
	@if [ -z "$$HOOKCLI_CHROMIUM" ] && ! command -v chromium >/dev/null 2>&1 \
	    && ! command -v chromium-browser >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	  else \
	    echo "make test-browser needs Chromium: run 'sudo apt-get install chromium' (Debian/Ubuntu)," \
	      "or point HOOKCLI_CHROMIUM at a Chromium or Chrome binary" >&2; \
	    exit 1; \
	  fi; \
	fi

test-browser: browser
	HOOKCLI_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q -m browser -p no:randomly tests/test_html_browser.py

# docs/html-*.png: one screenshot per kind of page (the html report), refreshed.
screenshots: browser
	$(BIN)/python docs/screenshots.py docs

run: $(STAMP)
	$(BIN)/hookcli inspect resnet18

lint: $(STAMP)
	$(BIN)/ruff check hookcli sample_models tests benchmarks noxfile.py
	$(BIN)/ruff format --check hookcli sample_models tests benchmarks noxfile.py
	$(BIN)/mypy

zoo: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests/test_zoo.py tests/test_cost_zoo.py

# Every slow test: the zoo, plus signal, example-script and CUDA tests (CUDA skips without one).
slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# Every benchmark to the end; the figures go to benchmarks/last-run.json.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py --json benchmarks/last-run.json

# The training-step peak: hookcli's tracker vs the allocator vs PyTorch's MemTracker
# (benchmarks/bench_memory.py; MEMORY=quick for a handful of models and settings).
MEMORY ?=
bench-memory: $(STAMP)
	HOOKCLI_BENCH_MEMORY=$(MEMORY) $(BIN)/python benchmarks/run.py memory

# One command: run every benchmark, then write README's and docs/performance.md's tables.
bench-docs: bench
	$(BIN)/python benchmarks/publish.py benchmarks/last-run.json

# Every example of README.md and docs/*.md re-run and compared (the slow ones too).
docs-check: $(STAMP)
	$(BIN)/python -m pytest -q -p no:randomly tests/test_docs_examples.py

# The torch matrix (noxfile.py): one venv per torch/torchvision pair in .nox/.
matrix: $(STAMP)
	$(BIN)/nox -s tests

matrix-zoo: $(STAMP)
	$(BIN)/nox -s zoo

# Every transformers AutoModel type / every timm model at full size on --device meta,
# one capped child each (long: see docs/models.md#coverage-on-meta; EVERY=N samples).
EVERY ?= 1
hf-coverage: $(STAMP)
	$(BIN)/python benchmarks/hf_coverage.py --source hf --every $(EVERY)

timm-coverage: $(STAMP)
	$(BIN)/python benchmarks/hf_coverage.py --source timm --every $(EVERY)

golden: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_golden.py --update-golden

clean:
	rm -rf $(VENV) .nox build *.egg-info .pytest_cache .mypy_cache .ruff_cache
