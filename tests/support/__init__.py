"""What the tests share across layers: real daemons, the PostgreSQL server and its
fixtures, backend calls, grants, held releases, the holder lock, the referee and
switchovers."""
