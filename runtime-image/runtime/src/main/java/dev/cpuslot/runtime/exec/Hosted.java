package dev.cpuslot.runtime.exec;

/**
 * A function this runtime hosts by name (Hydra's /register): its pool, its owner, its time limit
 * in milliseconds (0: the runtime's default). The registered functions are the co-located set that
 * local chain calls reach.
 */
public record Hosted(FunctionPool pool, String owner, long timeoutMs) {}
