# oncelog: one command to set up, run, test and measure.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: BASE_STAMP for what the broker needs (`make run`: the base dependencies), STAMP for everything
# (the dev and spark extras: tests, demo, benchmarks). Building STAMP also renews BASE_STAMP.
STAMP := $(VENV)/.setup-stamp
BASE_STAMP := $(VENV)/.base-stamp
DATA_DIR ?= ./data
LISTEN ?= 127.0.0.1:9092
PYTEST_ARGS ?=
# make test leaves out the slow runs against real Apache Kafka (the 3-node cluster, the long fault runs), the
# long cluster-mode runs, the secured-broker interop runs of other clients' builds and the other tests marked slow
# (a long single-node run whose capability keeps a short test in make test): `make kafka-test` runs every test
# against Kafka, `make cluster-test` every cluster-mode test, `make interop-test` the slow interop runs,
# `make slow-test` the rest.
TEST_MARKERS ?= not kafka_cluster and not kafka_slow and not cluster_slow and not interop_slow and not slow

.PHONY: setup run cluster test kafka-test interop-test slow-test coordination-setup cluster-test lint bench clean

$(BASE_STAMP): pyproject.toml
	@test -x $(PY) || { echo "setup: creating $(VENV) ($(PYTHON) -m venv)"; $(PYTHON) -m venv $(VENV); }
	@echo "setup: upgrading pip in $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@echo "setup: installing oncelog and its base dependencies into $(VENV) (pip install -e .)"
	@$(PY) -m pip install -q -e .
	@touch $(BASE_STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "setup: creating $(VENV) ($(PYTHON) -m venv)"; $(PYTHON) -m venv $(VENV); }
	@echo "setup: upgrading pip in $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@echo "setup: installing oncelog with the dev and spark extras into $(VENV) (pip install -e '.[dev,spark]', about 1 GB the first time)"
	@$(PY) -m pip install -q -e '.[dev,spark]'
	@touch $(STAMP) $(BASE_STAMP)

setup: $(STAMP)

# The broker alone needs only the base dependencies: no test tools, no Spark.
run: $(BASE_STAMP)
	$(VENV)/bin/oncelog serve --data-dir $(DATA_DIR) --listen $(LISTEN)

# A 3-broker cluster on loopback for development: ZooKeeper on CLUSTER_COORDINATION_PORT and brokers on
# CLUSTER_PORT, +1, +2, data and logs under CLUSTER_DATA_DIR (kept between runs); prints the bootstrap list,
# Ctrl-C stops everything. Needs java (and Maven the first time, for ZooKeeper's jars).
CLUSTER_DATA_DIR ?= ./data/cluster
CLUSTER_BROKERS ?= 3
CLUSTER_PORT ?= 9092
CLUSTER_COORDINATION_PORT ?= 2181
cluster: setup coordination-setup
	$(VENV)/bin/oncelog cluster start --data-dir $(CLUSTER_DATA_DIR) --brokers $(CLUSTER_BROKERS) \
		--port $(CLUSTER_PORT) --coordination-port $(CLUSTER_COORDINATION_PORT)

test: setup coordination-setup
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -q -m "$(TEST_MARKERS)" $(PYTEST_ARGS)

# ZooKeeper's jars (cluster mode's coordination service) resolved once by Maven and the classpath cached, so
# tests start it without Maven. Not part of `make run`: the single node needs no Java. Without java/mvn (or
# offline the first time) it says so and tests/cluster skips with the reason.
coordination-setup: setup
	@$(VENV)/bin/oncelog coordination classpath >/dev/null \
		|| echo "coordination-setup: ZooKeeper's jars not resolved; tests needing ZooKeeper will skip or fail"

# Every cluster-mode test, the long ones (cluster_slow) included: tests/cluster and the cluster fault runs.
cluster-test: setup coordination-setup
	$(PY) -m pytest -q tests/cluster tests/faults/test_cluster_fault_runs.py $(PYTEST_ARGS)

# oncelog's client, CLI and Spark pipelines against Apache Kafka 4.4 (KRaft; jars from Maven Central, cached in
# ~/.m2): one node with PLAINTEXT, SSL, SASL_SSL and SASL_PLAINTEXT listeners, and a 3-node cluster.
kafka-test: setup
	$(PY) -m pytest -q -m kafka tests/kafka $(PYTEST_ARGS)

# The Java client, Kafka's tools and franz-go against oncelog's secured listeners (docs/security.md), and Kafka
# Connect through SIGKILLs of its worker and the broker.
interop-test: setup
	$(PY) -m pytest -q -m interop_slow tests/interop $(PYTEST_ARGS)

# The single-node tests marked slow (offsets expiring after a minute, the Spark driver SIGKILLed mid-batch, the
# shortened `make demo`): about 2.5 minutes.
slow-test: setup
	$(PY) -m pytest -q -m "slow and not kafka_cluster and not kafka_slow and not cluster_slow and not interop_slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests bench

bench: setup
	$(PY) bench/produce_fetch.py

# oncelog's 3-broker cluster beside Apache Kafka 4.4 with 3 KRaft nodes (jars from Maven Central, cached in ~/.m2),
# interleaved, median of 3: produce MB/s and latency at RF 3, leader/controller SIGKILL, 10,000 partitions.
# About 10 minutes on 2 cores; BENCH_CLUSTER_ARGS passes options (e.g. "--runs 1 --partitions 2000").
BENCH_CLUSTER_ARGS ?=
.PHONY: bench-cluster
bench-cluster: setup coordination-setup
	$(PY) bench/cluster.py $(BENCH_CLUSTER_ARGS)

# Fault runs (tests/faults): RUNS runs, first every workload under all nemeses mixed, then each nemesis alone,
# each with every client of CLIENTS in turn (confluent-kafka and oncelog's own);
# prints the anomaly table and writes JSON to FAULTS_OUT (a directory or a .json path). Zero anomalies or exit 1.
# CLUSTER=1: three brokers on a 3-member ZooKeeper ensemble (needs make coordination-setup), the idempotent,
# consumer-group, transactional, exactly-once copy and Spark workloads, broker/controller/ZooKeeper kills, pauses
# past the session and inter-broker cuts and delays. SECURE=1 (with CLUSTER=1): the same on a secured cluster, SASL_SSL
# listeners (SCRAM-SHA-512 between brokers), ACLs on, the workers a principal with only their workload's ACLs; the
# Spark workload is left out (tests/faults/README.md).
RUNS ?= 3
SEED ?= 1
FAULT_SECONDS ?= 30
FAULTS_OUT ?= bench/results
CLIENTS ?= confluent,oncelog
# Fuzzing (tests/fuzz): fresh random inputs, FUZZ_EXAMPLES per in-process target, FUZZ_E2E_EXAMPLES requests
# (at most FUZZ_SECONDS) against a real broker, and on a secured broker's authentication path FUZZ_AUTH_EXAMPLES
# inputs per target (SASL conversations, TLS garbage; at most FUZZ_SECONDS) and FUZZ_AUTH_HALF_OPEN half-open
# handshakes of each kind at once.
FUZZ_EXAMPLES ?= 20000
FUZZ_E2E_EXAMPLES ?= 20000
FUZZ_AUTH_EXAMPLES ?= 5000
FUZZ_AUTH_HALF_OPEN ?= 400
FUZZ_SECONDS ?= 300
# then atheris (coverage-guided, libFuzzer) on the decoders and the authentication path for ATHERIS_SECONDS per
# target.
ATHERIS_SECONDS ?= 120

.PHONY: faults fuzz

faults: setup $(if $(CLUSTER),coordination-setup)
	$(PY) -m tests.faults.runner --runs $(RUNS) --seed $(SEED) --seconds $(FAULT_SECONDS) \
		--clients $(CLIENTS) --out $(FAULTS_OUT) $(if $(FAULTS_KEEP),--keep $(FAULTS_KEEP)) $(if $(CLUSTER),--cluster) \
		$(if $(SECURE),--secure)

fuzz: setup
	FUZZ_RANDOM=1 FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_E2E_EXAMPLES=$(FUZZ_E2E_EXAMPLES) FUZZ_SECONDS=$(FUZZ_SECONDS) \
		FUZZ_AUTH_EXAMPLES=$(FUZZ_AUTH_EXAMPLES) FUZZ_AUTH_HALF_OPEN=$(FUZZ_AUTH_HALF_OPEN) \
		$(PY) -m pytest -q -s -p no:cacheprovider tests/fuzz
	$(PY) -m tests.fuzz.atheris_fuzz --seconds $(ATHERIS_SECONDS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The exactly-once PySpark pipeline end to end (src/oncelog/spark/demo.py): about 1-2 minutes. With
# BOOTSTRAP=host:port it runs against an existing Kafka cluster; COMMAND_CONFIG="k=v ... | client.properties"
# gives its security settings. CLUSTER=1: on a 3-broker oncelog cluster of its own (ZooKeeper included), with
# the leader of the repartition topic's first partition SIGKILLed halfway through and restarted.
.PHONY: demo
demo: setup $(if $(CLUSTER),coordination-setup)
	PYSPARK_PYTHON=$(abspath $(PY)) PYSPARK_DRIVER_PYTHON=$(abspath $(PY)) $(PY) -m oncelog.spark.demo \
		$(if $(BOOTSTRAP),--bootstrap $(BOOTSTRAP)) $(foreach c,$(COMMAND_CONFIG),-X $(c)) $(if $(CLUSTER),--cluster)
