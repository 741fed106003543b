"""Watching a run while it trains: the collapse alarm, the online linear probe, the heartbeat file
and the k-NN math of the k-NN monitor (weighted_knn.py)."""
