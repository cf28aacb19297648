"""The oracle: the reference pool (which token should own each slot, from the allocator's answers alone),
the tag codec that carries a token's identity through any pool dtype, and the checker that compares the
pool under test with the reference and explains each difference as a finding."""
