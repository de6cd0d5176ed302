"""Safety: what agents' commands risk (``risk``). The policy, capabilities, audit and
guard of the safety issue build on it."""
