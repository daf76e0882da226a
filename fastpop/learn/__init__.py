"""The learner: the device state of a run (members, hparams, replay), the one update protocol every
strategy trains through, the replay store and the rate limiter."""
