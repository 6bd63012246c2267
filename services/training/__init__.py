"""Training on a cluster: jobs, recipes, their logs and metrics, and the models they start from
(:mod:`services.training.downloads`)."""
