"""Reference simulators: implementations under test, sharing no code with the spec."""
