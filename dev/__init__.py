"""The development kit: what the demos, tests and benchmarks use and production never imports:
a local Airflow deployment and its REST client (``dev.airflow``), its environment
(``dev.env``) and the data sets (``dev.data``)."""
