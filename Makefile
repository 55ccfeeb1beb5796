# The commands a newcomer needs: `make demo` and `make test` (both set up what is missing).
SHELL := /bin/bash
VENV := .venv/bin
DEMO_DAYS ?= 1997-09-22 1997-09-23 1997-09-24 1997-09-25 1997-09-26 1997-09-27 1997-09-28
DEMO_CONFIG ?= conf/movielens_deepfm.yaml

.PHONY: setup test demo data lock lint bench

setup:
	@scripts/setup.sh

data: setup
	$(VENV)/recpipe data fetch movielens-100k
	$(VENV)/recpipe data replay movielens-100k --out data/raw/movielens

# Until the DAG lands, the main job is feature preparation of the demo days.
demo: data
	$(VENV)/recpipe features --pipeline_config_path $(DEMO_CONFIG) $(addprefix --ds ,$(DEMO_DAYS))
	@echo "features: data/features/movielens/ds=*/ (stats in _stats.json, rejected rows in data/features/movielens_quarantine/)"

test: setup
	$(VENV)/ruff check .
	$(VENV)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/ruff check .

bench: setup
	$(VENV)/python bench/feature_prep.py
	$(VENV)/python bench/train_throughput.py

lock:
	$(VENV)/python -m pip freeze --all --exclude-editable | grep -viE '^(horovod|recpipe)==' \
	  | cat <(head -2 requirements.lock) - > requirements.lock.new && mv requirements.lock.new requirements.lock
