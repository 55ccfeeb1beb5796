-- One PostgreSQL for Airflow's metadata and MLflow's backend store, in separate databases.
CREATE DATABASE airflow;
CREATE DATABASE mlflow;
