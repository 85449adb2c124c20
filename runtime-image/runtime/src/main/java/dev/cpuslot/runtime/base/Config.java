package dev.cpuslot.runtime.base;

import java.util.Map;

/** Runtime settings, all from the environment (names documented in runtime-image/README.md). */
public record Config(
        int port,
        int metricsPort,
        boolean slotsEnabled,
        String agentSocket,
        long acquireBudgetMs,
        long firstAcquireBudgetMs,    // budget of the acquisitions before the first grant (a new container's cold first round trip)
        boolean failClosed,
        int sandboxesPerFunction,
        long defaultTimeoutMs,
        long workerIdleMs,
        String defaultQuota,          // pod default, e.g. from the downward API
        boolean defaultLend,          // CPUSLOT_DEFAULT_LEND: actions that say nothing sleep in their chain calls (when the agent lends)
        long maxQuotaMilli,           // cap for every source; 0 = no cap
        boolean allowInvocationQuota, // OpenWhisk/Hydra: value.__cpuslot_quota
        boolean allowHeaderQuota,     // Knative/Hydra: X-Cpuslot-Quota header
        boolean annotationLookup,     // OpenWhisk: read the action's annotation via the REST API
        String annotationKey,
        long annotationTimeoutMs,
        String apiHost,               // __OW_API_HOST
        String language,              // force the language of OpenWhisk/Knative /init code
        boolean reportInBody,         // Hydra/Knative: add "cpuslot" usage to the reply
        boolean usageInReply,         // every answer carries its CPU usage (counters read before the reply)
        long lingerMs,                // keep a worker's lease between invocations (0 = off)
        boolean warmup,               // get the slot client ready at init/register (and at start)
        long warmupWaitMs,            // how long /init (/register) waits for the slot client's warm-up
        boolean connectAtStart,       // warm up the slot client at start (default: when CPUSLOT_SOCKET is set)
        long readyWaitMs,             // when connecting at start: not ready (GET /ready, /init) until the agent serves, at most this long
        String log,                   // where the runtime's own lines go (CPUSLOT_LOG; never the tenant's streams by default)
        long logMaxBytes,             // rotate the log file once past this size
        boolean owConcurrent,         // __OW_ALLOW_CONCURRENT: OpenWhisk sends overlapping /run to this container
        int owMaxConcurrency,         // bound of sandboxes per OpenWhisk action when concurrent
        boolean enforceDeadline,      // cancel an activation at __OW_DEADLINE (past deadlines: default timeout)
        String runawayQuota,          // the slot a worker that ignores its deadline is confined to
        long runawayGraceMs,          // how long a cancelled worker may take to stop before that
        boolean local,                // local leasing: the process holds slots and leases them to workers itself
        long localIdleMs,             // a held slot unused this long goes back to the agent
        boolean javaTrusted,          // CPUSLOT_JAVA_TRUSTED: the Java guard refuses nothing (trusted code only)
        int javaMaxThreads,           // CPUSLOT_JAVA_MAX_THREADS: most live threads one Java function may have made (0: no limit)
        int activationLogBytes,       // CPUSLOT_ACTIVATION_LOG_BYTES: most stdout+stderr bytes one activation keeps (OpenWhisk's default log limit)
        String owner,                 // CPUSLOT_OWNER: the one owner served (null: the first one seen; "*": any)
        String controlTokenFile,      // CPUSLOT_CONTROL_TOKEN_FILE: /register, /deregister, /warmup need its token (null: none)
        boolean controlEndpoints,     // CPUSLOT_CONTROL_ENDPOINTS: false: /register, /deregister, /warmup refused to everyone (Knative, OpenWhisk: unused)
        int chainMaxDepth,            // CPUSLOT_CHAIN_MAX_DEPTH: most nested chain calls below a platform's activation
        int chainMaxAsync,            // CPUSLOT_CHAIN_MAX_ASYNC: most asynchronous chain calls per activation
        int chainMaxPending,          // CPUSLOT_CHAIN_MAX_PENDING: most asynchronous chain calls pending in the runtime
        String chainUrl,              // CPUSLOT_CHAIN_URL: a callee not here goes to this URL ({name}, {namespace}), e.g. a Knative service's
        String chainUrls,             // CPUSLOT_CHAIN_URLS: name=url,... for callees not here (before CPUSLOT_CHAIN_URL)
        String chainSteps,            // CPUSLOT_CHAIN_STEPS: the steps that follow the container's action (Knative: its env)
        int frontMaxRequests,         // CPUSLOT_FRONT_MAX_REQUESTS: most requests the HTTP front serves at once (one thread each); one more: 503
        long frontReadTimeoutMs,      // CPUSLOT_FRONT_READ_TIMEOUT: longest a request may take to arrive, headers and body (0 = no limit)
        long drainTimeoutMs,          // CPUSLOT_DRAIN_TIMEOUT: on SIGTERM, how long running invocations may take to finish
        String logFormat,             // CPUSLOT_LOG_FORMAT: text (default) or json (one object per line)
        long compilerWarmupMs,        // CPUSLOT_COMPILER_WARMUP: the prewarm runs guest code this long so that the JIT compiler warms up (0 = off)
        String compilerQuota) {       // CPUSLOT_COMPILER_QUOTA: the slot of the compiler threads, HotSpot's and Truffle's (0 = off: the container's cgroup)

    public static final String QUOTA_PARAM = "__cpuslot_quota";
    public static final String QUOTA_HEADER = "X-Cpuslot-Quota";
    /**
     * Request header: {@code reply} asks for the invocation's CPU usage in its answer
     * ({@code X-Cpuslot-Cpu-Ns}, {@code X-Cpuslot-Throttled-Ns}); the slot's counters are then read
     * before the reply instead of after it.
     */
    public static final String USAGE_HEADER = "X-Cpuslot-Usage";
    public static final String INIT_QUOTA_ENV = "CPUSLOT_QUOTA";
    /** Per action (/init env, Hydra /register?lend=): whether its invocations sleep in their chain calls. */
    public static final String INIT_LEND_ENV = "CPUSLOT_LEND";
    /** Per action (/init env): most sandboxes this action may use, at most the runtime's bound. */
    public static final String INIT_SANDBOXES_ENV = "CPUSLOT_SANDBOXES";
    /** The largest request body, and the most a function's zip may unpack to. */
    public static final int MAX_BODY = 64 << 20;

    public static Config fromEnv() { return from(System.getenv()); }

    public static Config from(Map<String, String> env) {
        return new Config(
                intOf(env, "PORT", 8080),
                intOf(env, "CPUSLOT_METRICS_PORT", 9102),
                bool(env, "CPUSLOT_ENABLED", true),
                env.getOrDefault("CPUSLOT_SOCKET", "/run/cpuslot/agent.sock"),
                longOf(env, "CPUSLOT_ACQUIRE_BUDGET_MS", 50),
                longOf(env, "CPUSLOT_FIRST_ACQUIRE_BUDGET_MS", 1000),
                bool(env, "CPUSLOT_FAIL_CLOSED", false),
                intOf(env, "CPUSLOT_SANDBOXES_PER_FUNCTION", Math.max(4, 4 * Runtime.getRuntime().availableProcessors())),
                longOf(env, "CPUSLOT_DEFAULT_TIMEOUT_MS", 60_000),
                longOf(env, "CPUSLOT_WORKER_IDLE_MS", 60_000),
                blankToNull(env.get("CPUSLOT_DEFAULT_QUOTA")),
                bool(env, "CPUSLOT_DEFAULT_LEND", true),
                longOf(env, "CPUSLOT_MAX_QUOTA_MILLI", 0),
                bool(env, "CPUSLOT_ALLOW_INVOCATION_QUOTA", false),
                bool(env, "CPUSLOT_ALLOW_HEADER_QUOTA", false),
                bool(env, "CPUSLOT_ANNOTATION_LOOKUP", true),
                env.getOrDefault("CPUSLOT_ANNOTATION", "cpu-quota"),
                longOf(env, "CPUSLOT_ANNOTATION_TIMEOUT_MS", 2000),
                blankToNull(env.get("__OW_API_HOST")),
                blankToNull(env.get("CPUSLOT_LANGUAGE")),
                bool(env, "CPUSLOT_REPORT_IN_BODY", false),
                bool(env, "CPUSLOT_USAGE_IN_REPLY", false),
                durationMs(env, "CPUSLOT_LINGER", 100),
                bool(env, "CPUSLOT_WARMUP", true),
                Math.max(0, durationMs(env, "CPUSLOT_WARMUP_WAIT", 1000)),
                bool(env, "CPUSLOT_CONNECT_AT_START", env.get("CPUSLOT_SOCKET") != null && !env.get("CPUSLOT_SOCKET").isBlank()),
                Math.max(0, durationMs(env, "CPUSLOT_READY_WAIT", 30_000)),
                blankToNull(env.get("CPUSLOT_LOG")),
                longOf(env, "CPUSLOT_LOG_MAX_BYTES", 10L << 20),
                bool(env, "__OW_ALLOW_CONCURRENT", false),
                Math.max(1, intOf(env, "CPUSLOT_OW_MAX_CONCURRENCY", 256)),
                bool(env, "CPUSLOT_ENFORCE_DEADLINE", true),
                env.getOrDefault("CPUSLOT_RUNAWAY_QUOTA", "10m"),
                Math.max(0, durationMs(env, "CPUSLOT_RUNAWAY_GRACE", 200)),
                bool(env, "CPUSLOT_LOCAL", true),
                Math.max(0, durationMs(env, "CPUSLOT_LOCAL_IDLE", 30_000)),
                bool(env, "CPUSLOT_JAVA_TRUSTED", false),
                nonNegative(env, "CPUSLOT_JAVA_MAX_THREADS", 64),
                nonNegative(env, "CPUSLOT_ACTIVATION_LOG_BYTES", 10 << 20),
                blankToNull(env.get("CPUSLOT_OWNER")),
                blankToNull(env.get("CPUSLOT_CONTROL_TOKEN_FILE")),
                bool(env, "CPUSLOT_CONTROL_ENDPOINTS", true),
                nonNegative(env, "CPUSLOT_CHAIN_MAX_DEPTH", 16),
                nonNegative(env, "CPUSLOT_CHAIN_MAX_ASYNC", 16),
                nonNegative(env, "CPUSLOT_CHAIN_MAX_PENDING", 256),
                blankToNull(env.get("CPUSLOT_CHAIN_URL")),
                blankToNull(env.get("CPUSLOT_CHAIN_URLS")),
                blankToNull(env.get("CPUSLOT_CHAIN_STEPS")),
                // 512: above what a platform sanely sends one container at once (Knative's default
                // target is 100 per pod; an OpenWhisk action here has at most 256 sandboxes,
                // CPUSLOT_OW_MAX_CONCURRENCY), so only a burst past the platform's bound meets it;
                // far below a pod's pids limit, so the runtime still has threads to answer with
                positive(env, "CPUSLOT_FRONT_MAX_REQUESTS", 512),
                // 30 s: a platform's request arrives in far less (OpenWhisk's largest action, 48 MB,
                // in about 4 s at 100 Mbit/s); a client slower than that holds a front thread
                Math.max(0, durationMs(env, "CPUSLOT_FRONT_READ_TIMEOUT", 30_000)),
                Math.max(0, durationMs(env, "CPUSLOT_DRAIN_TIMEOUT", 25_000)),
                logFormat(env.get("CPUSLOT_LOG_FORMAT")),
                Math.max(0, durationMs(env, "CPUSLOT_COMPILER_WARMUP", 0)),
                env.getOrDefault("CPUSLOT_COMPILER_QUOTA", "0"));
    }

    /** A duration: {@code 100ms}, {@code 2s}, {@code 500us} (rounded up to ms), or plain milliseconds; 0 = off. */
    static long durationMs(Map<String, String> env, String k, long def) {
        String v = env.get(k);
        if (v == null || v.isBlank()) return def;
        String t = v.trim().toLowerCase(java.util.Locale.ROOT);
        try {
            if (t.endsWith("ms")) return Long.parseLong(t.substring(0, t.length() - 2).trim());
            if (t.endsWith("us")) return (Long.parseLong(t.substring(0, t.length() - 2).trim()) + 999) / 1000;
            if (t.endsWith("s")) return Math.round(Double.parseDouble(t.substring(0, t.length() - 1).trim()) * 1000);
            return Long.parseLong(t);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(k + " is not a duration (e.g. 100ms, 1s, 0): " + v);
        }
    }

    private static String logFormat(String v) {
        String f = v == null || v.isBlank() ? "text" : v.trim().toLowerCase(java.util.Locale.ROOT);
        if (!f.equals("text") && !f.equals("json")) throw new IllegalArgumentException("CPUSLOT_LOG_FORMAT must be text or json: " + v);
        return f;
    }

    private static String blankToNull(String s) { return s == null || s.isBlank() ? null : s.trim(); }

    private static int intOf(Map<String, String> env, String k, int def) { return (int) longOf(env, k, def); }

    private static int nonNegative(Map<String, String> env, String k, int def) { return count(env, k, def, 0); }

    private static int positive(Map<String, String> env, String k, int def) { return count(env, k, def, 1); }

    private static int count(Map<String, String> env, String k, int def, int least) {
        long v = longOf(env, k, def);
        if (v < least || v > Integer.MAX_VALUE) throw new IllegalArgumentException(k + " is not a count (" + least + " or more): " + v);
        return (int) v;
    }

    private static long longOf(Map<String, String> env, String k, long def) {
        String v = env.get(k);
        if (v == null || v.isBlank()) return def;
        try {
            return Long.parseLong(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(k + " is not a number: " + v);
        }
    }

    private static boolean bool(Map<String, String> env, String k, boolean def) {
        String v = env.get(k);
        if (v == null || v.isBlank()) return def;
        return parseBool(k, v);
    }

    /** A setting's yes or no: 1/true/yes/on or 0/false/no/off, any case; else a typed error naming {@code k}. */
    public static boolean parseBool(String k, String v) {
        return switch (v.trim().toLowerCase(java.util.Locale.ROOT)) {
            case "1", "true", "yes", "on" -> true;
            case "0", "false", "no", "off" -> false;
            default -> throw new IllegalArgumentException(k + " is not a boolean (true or false): " + v);
        };
    }
}
