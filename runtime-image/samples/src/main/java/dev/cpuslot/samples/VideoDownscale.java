package dev.cpuslot.samples;

import com.google.gson.JsonObject;

import java.security.MessageDigest;
import java.util.HexFormat;

/**
 * Video processing: generates {@code frames} raw RGB frames of {@code width}x{@code height}
 * in-process (a moving gradient, deterministic) and downscales each by {@code factor} with a box
 * filter, as a transcoder's scaler does. Returns the output geometry and a digest of the output.
 * (No ffmpeg needed: the work is the same pixel arithmetic, and the result is checkable.)
 */
public class VideoDownscale {
    public static JsonObject main(JsonObject args) throws Exception {
        int w = get(args, "width", 640), h = get(args, "height", 360), frames = get(args, "frames", 30),
                f = get(args, "factor", 2);
        if (w <= 0 || h <= 0 || frames <= 0 || f <= 0 || w % f != 0 || h % f != 0 || (long) w * h * frames > 200_000_000L)
            throw new IllegalArgumentException("bad geometry");
        int ow = w / f, oh = h / f;
        byte[] in = new byte[w * h * 3], out = new byte[ow * oh * 3];
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        for (int t = 0; t < frames; t++) {
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++) {
                    int p = (y * w + x) * 3;
                    in[p] = (byte) (x + t);
                    in[p + 1] = (byte) (y + 2 * t);
                    in[p + 2] = (byte) ((x ^ y) + 3 * t);
                }
            for (int y = 0; y < oh; y++)
                for (int x = 0; x < ow; x++)
                    for (int c = 0; c < 3; c++) {
                        int sum = 0;
                        for (int dy = 0; dy < f; dy++)
                            for (int dx = 0; dx < f; dx++) sum += in[((y * f + dy) * w + (x * f + dx)) * 3 + c] & 0xFF;
                        out[(y * ow + x) * 3 + c] = (byte) (sum / (f * f));
                    }
            sha.update(out);
        }
        JsonObject o = new JsonObject();
        o.addProperty("frames", frames);
        o.addProperty("input", w + "x" + h);
        o.addProperty("output", ow + "x" + oh);
        o.addProperty("sha256", HexFormat.of().formatHex(sha.digest()));
        return o;
    }

    private static int get(JsonObject a, String k, int def) { return a.has(k) ? a.get(k).getAsInt() : def; }
}
