"""The feature job: a day's raw logs to the features training reads (``features.prepare``)."""

# the Spark Connect URL (a token included) as a feature job reads it: in its environment,
# never on its command line, where every user of the host can read it
REMOTE_ENV = "RECPIPE_SPARK_REMOTE"
# Spark Connect's default port: the feature job's server listens there (features.connect_server)
CONNECT_PORT = 15002
