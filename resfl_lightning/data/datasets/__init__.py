"""One module per dataset: a FederatedDataset subclass (base.py) that conf/dataset/<name>.yaml names in `_target_`."""
