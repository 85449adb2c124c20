/**
 * The Java guard: what a function's bytecode is checked for and rewritten to ({@link
 * dev.cpuslot.runtime.guard.Rewriter}, {@link dev.cpuslot.runtime.guard.FilePaths}), and the classes
 * the rewritten code calls, one per concern, each with its own state. The one package a function's
 * class loader shares with the runtime (the rewritten calls must reach the same state for every
 * function); function code cannot name its classes (the rewriter refuses every reference under
 * {@code dev/cpuslot/runtime/}) nor act on them by reflection ({@link
 * dev.cpuslot.runtime.guard.OwnReflection}).
 */
package dev.cpuslot.runtime.guard;
