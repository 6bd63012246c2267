"""MLflow for training jobs: the tracking server, the jobs' runs and the metrics read from them."""
