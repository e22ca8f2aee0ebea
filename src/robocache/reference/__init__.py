"""Private pure-PyTorch implementations: the CPU path of every op and the oracle its tests use."""
