"""PODS inside other training libraries: ``podsrl.integrations.trl`` (TRL's GRPOTrainer)."""
