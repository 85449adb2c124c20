package dev.cpuslot.runtime.core;

import dev.cpuslot.runtime.guard.Activations;
import dev.cpuslot.runtime.base.Log;

/**
 * The runtime owns its process. A thread of the runtime's that ends with an {@link Error} (an
 * {@link OutOfMemoryError} a function's allocation caused where the guard does not check it, in a
 * Python function, in the HTTP dispatcher, the heap watch, local leasing, a worker) leaves the
 * runtime unable to serve, with nothing to restart it in process: the process then exits (not
 * ready first) so that the platform restarts it, rather than stay alive and deaf. A thread a
 * function started is the function's: its end is printed (to that activation's stderr) and
 * nothing else happens.
 */
final class ProcessGuard {
    /** The exit status (EX_SOFTWARE): the runtime could not go on. */
    static final int EXIT = 70;

    private ProcessGuard() {}

    static void install(Readiness readiness) {
        Thread.setDefaultUncaughtExceptionHandler((t, e) -> {
            // out of memory still: each step may fail, and the exit must not depend on any of them
            boolean runtimes = true;
            try {
                runtimes = e instanceof Error && !Activations.functionThread();
            } catch (Throwable ignored) {
            }
            if (!runtimes) {
                try {
                    System.err.print("Exception in thread \"" + t.getName() + "\" ");
                    e.printStackTrace(System.err);
                } catch (Throwable ignored) { // nothing more to say
                }
                return;
            }
            try {
                readiness.broken(BROKEN);
                Log.warn("the runtime's thread " + t.getName() + " ended (" + e + "): exiting with " + EXIT
                        + " so that the platform restarts the runtime");
            } catch (Throwable ignored) {
            }
            Runtime.getRuntime().halt(EXIT);
        });
    }

    private static final String BROKEN = "a thread of the runtime ended: the runtime exits";
}
