# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv crds chart-files kubevirt-crds kubevirt control-plane image lint unit integration test soak demo dev-cluster bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(STAMP)

# Regenerate crds/ and the chart's crds/ (which `helm install` creates) from the models in operator/cozygpu/api.
crds: venv
	$(BIN)/cozygpu crds

# The chart's generated files: the no-bypass policy (§12) and the webhooks' configurations, from
# cozygpu.runtime.admission.policy and .chart, and values.schema.json from values.yaml and the operator's
# settings (hack/chart-schema.py); unit tests and make lint fail on drift.
chart-files: venv
	$(BIN)/python hack/chart-schema.py
	$(BIN)/python -c "from cozygpu.runtime.admission import policy; print(policy.chart_file(), end='')" \
	  > charts/cozy-gpu-operator/files/no-bypass-policy.yaml
	$(BIN)/python -c "from cozygpu.runtime.admission import chart; print(chart.chart_file(), end='')" \
	  > charts/cozy-gpu-operator/files/webhooks.json

# KubeVirt's full CRD set for the test control plane, printed by kv-dump from KubeVirt's source.
kubevirt-crds:
	kv="$$(bash hack/build-kubevirt.sh | tail -n 1)" && { \
	  echo "# KubeVirt's CustomResourceDefinitions, all that virt-operator installs, printed by"; \
	  echo "# kv-dump -what=crds (tools/kv-dump of the KubeVirt source, see hack/build-kubevirt.sh)"; \
	  echo "# from KubeVirt commit $$(basename "$$kv") (Apache-2.0). Regenerate: make kubevirt-crds."; \
	  "$$kv/kv-dump" -what=crds; } > tests/fixtures/kubevirt/crds.yaml

# Build (or find cached) etcd, kube-apiserver and what tests also run; prints where they are.
CONTROL_PLANE_EXTRAS := kube-scheduler kube-controller-manager kubectl helm
control-plane:
	bash hack/build-control-plane.sh $(CONTROL_PLANE_EXTRAS)

# The operator's image (hack/Dockerfile) with docker, buildah or podman, whichever works here; from
# python:3.11-slim, or a Debian base made with mmdebstrap where no registry answers. Prints its name.
image:
	bash hack/build-image.sh

# tests/e2e starts kind through pytest-kind, which downloads KIND_VERSION; from v0.24.0 kindnet enforces
# NetworkPolicy, which the chart's policy test needs (it skips, saying so, on an older kind).
export KIND_VERSION ?= v0.24.0

lint: venv
	$(BIN)/ruff check operator tests hack bench
	$(BIN)/ruff format --check operator tests hack bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/cozygpu crds --check
	$(BIN)/python hack/chart-schema.py --check

unit: venv
	$(BIN)/pytest tests/unit

test: lint control-plane kubevirt
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh $(CONTROL_PLANE_EXTRAS) | tail -n 1)" $(BIN)/pytest --durations=10

# The reliability tier at length (issue 12; docs/reliability.md): 1,000 kill -9 runs, crash-at-every-write
# sweeps, 100,000 fuzzed reviews, API server faults, 1,000 stop/start cycles through VMs; prints runs,
# violations and recovery times. Hours: each scenario stops after SOAK_MINUTES and says so.
SOAK_MINUTES ?= 100
soak: venv control-plane kubevirt
	COZYGPU_SOAK=1 COZYGPU_SOAK_MINUTES=$(SOAK_MINUTES) COZYGPU_KV_CYCLES=1000 \
	  KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh $(CONTROL_PLANE_EXTRAS) | tail -n 1)" \
	  $(BIN)/pytest tests/reliability tests/kubevirt/test_lifecycle.py::test_stop_and_start_keeps_the_held_gpu_on_its_node_every_time

# KubeVirt's virt-controller, virt-api and kv-dump for tests/kubevirt and the demo, built from
# KubeVirt's source (hack/build-kubevirt.sh); without a source they skip, saying why.
kubevirt:
	@bash hack/build-kubevirt.sh >/dev/null; rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "make: KubeVirt is not available: its tests and demo parts skip"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

# A local control plane with fake GPU nodes, KubeVirt where available, and a short story.
demo: venv kubevirt
	bash hack/build-control-plane.sh kube-scheduler >/dev/null
	$(BIN)/python hack/demo.py

# The control plane alone, in the foreground, for trying things by hand.
DEV_CLUSTER_FLAGS ?=
dev-cluster: venv control-plane
	$(BIN)/cozygpu dev-cluster --kubeconfig .dev/kubeconfig $(DEV_CLUSTER_FLAGS)

# Figures, each beside its peer (prints, asserts nothing; never part of make test): the decision
# paths in memory, a simulated day with idle moves and without (§5.7), a replica's CPU per watch
# event against its size (beside the line reader before), the binder against
# kube-scheduler, admission against its chain of writes and beside another tenant's largest VMIs,
# a VM start through KubeVirt beside one without GPUs.
BENCH_SIZES ?= 1000:5000 5000:20000
bench: venv kubevirt
	bash hack/build-control-plane.sh kube-scheduler >/dev/null
	$(BIN)/python bench/placement.py --nodes 1000 --devices 5000
	$(BIN)/python bench/placement.py --nodes 5000 --devices 20000 --tenants 10000
	$(BIN)/python bench/placement.py --nodes 20000 --devices 50000 --rounds 50
	$(BIN)/python bench/day.py --nodes 200
	$(BIN)/python bench/events.py
	for size in $(BENCH_SIZES); do \
	  KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh kube-scheduler | tail -n 1)" \
	    $(BIN)/python bench/binder.py --nodes $${size%%:*} --devices $${size##*:} || exit 1; done
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/admission.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/neighbour.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/orders.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh kube-scheduler | tail -n 1)" \
	  $(BIN)/python bench/backlog.py --nodes 2000 --cold 10000
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/backlog.py --nodes 5000 --cold 0
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/scale.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/failover.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh | tail -n 1)" $(BIN)/python bench/rolling.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh kube-scheduler | tail -n 1)" $(BIN)/python bench/vmstart.py
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh kube-scheduler | tail -n 1)" \
	  $(BIN)/python bench/vmstart.py --concurrency 100 --rate 10 --rounds 2
	KUBEBUILDER_ASSETS="$$(bash hack/build-control-plane.sh kube-scheduler | tail -n 1)" $(BIN)/python bench/drain.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .dev
