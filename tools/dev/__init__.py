"""Development scripts and the library the tests and the benches share (the simulated
fleet, host shapes, daemons started and stopped by PID, a throwaway PostgreSQL). Not
part of the product: the wheel leaves it out (setup.cfg)."""
