package dev.cpuslot.runtime.lang;

import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.chain.Chain;
import dev.cpuslot.chain.ChainException;
import dev.cpuslot.chain.ChainException.Kind;

/**
 * Local chaining for JavaScript and Python ({@code cpuslot.call}, {@code cpuslot.callAsync} /
 * {@code call_async}): through the chain API a Java function calls too ({@link Chain}, which the
 * runtime binds to the activation's thread), JSON in, {@code {"result": ...}} or
 * {@code {"error", "kind"}} out, which the prelude turns into a ChainError of the guest's own
 * language.
 */
final class GuestChain {
    private GuestChain() {}

    static String call(String mode, String callee, String argsJson) {
        JsonObject out = new JsonObject();
        try {
            JsonElement args;
            try {
                args = JsonParser.parseString(argsJson == null ? "{}" : argsJson);
            } catch (RuntimeException e) {
                throw new ChainException(Kind.NO_CONTEXT, callee, "the arguments are not JSON: " + e.getMessage());
            }
            if ("async".equals(mode)) {
                Chain.callAsync(callee, args);
                out.add("result", JsonNull.INSTANCE);
            } else {
                out.add("result", Chain.call(callee, args));
            }
        } catch (ChainException e) {
            out.addProperty("error", e.getMessage());
            out.addProperty("kind", e.kind().name());
        }
        return out.toString();
    }
}
