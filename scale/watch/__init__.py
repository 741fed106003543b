"""Watching a run while it trains: the collapse alarm, the online linear probe and the heartbeat file."""
