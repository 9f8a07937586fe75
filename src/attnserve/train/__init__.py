"""Training, the `attnserve adapt` verb: adapt.py distills what a variant adds (`adapt variant`),
the weights that ship in weights/ and that serving loads with --weights. Nothing here is served
by itself: the service imports none of it. (Context heads and the training-documents scraper,
which no deployment serves, are research tools outside the package: research/README.md.)"""
