"""A run's own facts, apart from the path records take: what the sidecar knows of it now
(run_state), how far it is (progress), its verdict, its checkpoints clean or suspect
(checkpoint_ledger), its lifecycle (one state machine), and where its time went (goodput).
"""
