package dev.cpuslot.slot;

import java.nio.charset.StandardCharsets;

/**
 * Names of the per-invocation path ({@link Leases}): outcomes and placements as the spec names
 * them, the counters named after them, and the clipping of the action and invocation names a
 * caller gives. The per-invocation path is one object written in one file per part:
 * {@link LeaseNames} (names and clipping), {@link LeaseRelease} (what it holds, and RELEASE),
 * {@link LeaseLending} (SLEEP and WAKE), {@link Lingering} and {@link Leases} (acquire), each class
 * extending the one before it and calling only what it and the classes before it declare; what a
 * later part uses is package-private and final.
 */
abstract sealed class LeaseNames permits LeaseRelease {
    static String outcomeName(int o) {
        return switch (o) {
            case Protocol.OUTCOME_AFFINITY_HIT -> "affinity_hit";
            case Protocol.OUTCOME_CACHE_HIT -> "cache_hit";
            case Protocol.OUTCOME_RETUNED -> "retuned";
            case Protocol.OUTCOME_CREATED -> "created";
            default -> "none";
        };
    }

    static String placeName(int p) {
        return switch (p) {
            case Protocol.PLACE_NONE -> "none";
            case Protocol.PLACE_SELF -> "self";
            case Protocol.PLACE_DONE -> "done";
            default -> "unknown";
        };
    }

    /** Counter names of the acquire path (own methods so that warm-up links their string concatenation). */
    static String acquireCounter(int outcome) { return "acquire." + outcomeName(outcome); }
    static String placeCounter(int place) { return "place." + placeName(place); }

    /**
     * Makes a protocol string of s: control characters and unpaired surrogates (which the
     * encoder refuses) become U+FFFD, and it is clipped to 1024 UTF-8 bytes without splitting a
     * character.
     */
    static String clip(String s) {
        if (s == null) return "";
        if (s.length() * 3 <= Protocol.MAX_STRING && plain(s)) return s; // at most 3 UTF-8 bytes a char: fits
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isISOControl(c) || Character.isSurrogate(c)) {
                s = sanitize(s);
                break;
            }
        }
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        if (b.length <= Protocol.MAX_STRING) return s;
        int n = Protocol.MAX_STRING;
        while (n > 0 && (b[n] & 0xC0) == 0x80) n--;
        return new String(b, 0, n, StandardCharsets.UTF_8);
    }

    private static boolean plain(String s) {
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isISOControl(c) || Character.isSurrogate(c)) return false;
        }
        return true;
    }

    private static String sanitize(String s) {
        StringBuilder b = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                b.append(c).append(s.charAt(++i));
            } else if (Character.isISOControl(c) || Character.isSurrogate(c)) {
                b.append('\uFFFD');
            } else {
                b.append(c);
            }
        }
        return b.toString();
    }
}
