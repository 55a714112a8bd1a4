"""Training: the run's settings (``config``), ``model.fit`` (``train``), its run folder, devices and backends."""
