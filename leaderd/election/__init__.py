"""The election: the engine and its rules, what it watches and remembers, the node."""
