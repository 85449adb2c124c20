package dev.cpuslot.it;

import java.util.Map;
import java.util.TreeMap;

/** Prometheus text format, just enough: "name{labels}" -> value. */
final class Prom {
    private Prom() {}

    static Map<String, Double> parse(String text) {
        Map<String, Double> m = new TreeMap<>();
        for (String line : text.split("\n")) {
            if (line.isBlank() || line.startsWith("#")) continue;
            int sp = line.lastIndexOf(' ');
            if (sp <= 0) continue;
            try {
                m.put(line.substring(0, sp).trim(), Double.parseDouble(line.substring(sp + 1).trim()));
            } catch (NumberFormatException ignored) {
            }
        }
        return m;
    }

    static double get(Map<String, Double> m, String key) { return m.getOrDefault(key, 0.0); }

    /** Sum of all series of a metric whose labels contain every given fragment. */
    static double sum(Map<String, Double> m, String name, String... fragments) {
        double s = 0;
        for (Map.Entry<String, Double> e : m.entrySet()) {
            String k = e.getKey();
            if (!(k.equals(name) || k.startsWith(name + "{"))) continue;
            boolean all = true;
            for (String f : fragments) all &= k.contains(f);
            if (all) s += e.getValue();
        }
        return s;
    }
}
