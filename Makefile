# The commands a newcomer needs: `make demo` and `make test` (both set up what is missing).
SHELL := /bin/bash
VENV := .venv/bin
DEMO_DAYS ?= 7
STREAM_DAYS ?= 1
STREAM_DAY ?= 1997-09-27
PASS_MINUTES ?= 60

.PHONY: setup test demo demo-stream data data-hourly lock lint bench airflow mlflow docs

setup:
	@scripts/setup.sh

data: setup
	$(VENV)/recpipe data fetch movielens-100k
	$(VENV)/recpipe data replay movielens-100k --out data/raw/movielens

data-hourly: data
	$(VENV)/recpipe data replay movielens-100k --granularity hour --out data/raw/movielens_hourly

# The main job: recpipe_daily_retrain for 7 consecutive days, an Airflow backfill under the
# scheduler (LocalExecutor), each task printed as it ends, then a table of the results.
demo: data
	$(VENV)/python scripts/demo.py --days $(DEMO_DAYS)

# Replayed days of hourly passes through recpipe_stream_retrain (needs Redis on 127.0.0.1):
# STREAM_DAYS=3 for the multi-day run (a table of each day's close at the end); PASS_MINUTES=15
# for passes of 15 minutes (its own model and DAG, recpipe_stream_retrain_15min). After `make demo`
# the stream's first day (STREAM_DAY, the day after the daily demo's) starts from its champion
demo-stream: data-hourly
	$(VENV)/python scripts/demo_stream.py --day $(STREAM_DAY) --days $(STREAM_DAYS) --pass_minutes $(PASS_MINUTES)

airflow: setup
	@scripts/airflow_up.sh

mlflow: setup
	@scripts/mlflow_up.sh

# the suite in TEST_WORKERS pytest-xdist processes, a file at a time (tests/conftest.py keeps
# the files of the daily DAG's four days together); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 3
test: setup
	$(VENV)/ruff check .
	$(VENV)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: setup
	$(VENV)/ruff check .

bench: setup
	$(VENV)/python bench/feature_prep.py
	$(VENV)/python bench/train_throughput.py
	$(VENV)/python docs/hooks/render.py

lock:
	$(VENV)/python -m pip freeze --all --exclude-editable | grep -viE '^(horovod|recpipe)==' \
	  | cat <(head -2 requirements.lock) - > requirements.lock.new && mv requirements.lock.new requirements.lock

# the pages' figures and references written from their sources, then the site
docs: setup
	$(VENV)/python docs/hooks/render.py
	$(VENV)/mkdocs build --strict
