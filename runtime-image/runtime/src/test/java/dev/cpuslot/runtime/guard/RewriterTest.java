package dev.cpuslot.runtime.guard;

import org.junit.jupiter.api.Test;

import java.lang.constant.ClassDesc;
import java.lang.constant.MethodTypeDesc;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;

class RewriterTest {
    /**
     * Every call the guard rewrites lands on a method of its guard class, of the type the rewrite emits
     * (the call's, a virtual call's receiver first as an Object): a missing one is a
     * NoSuchMethodError in the function instead of the guard's answer. (Before: Runtime.exit and
     * Runtime.halt were rewritten to methods taking a Runtime, and failed so.)
     */
    @Test
    void everyRewrittenCallHasItsGuardMethod() throws Exception {
        List<String> missing = new ArrayList<>();
        MethodHandles.Lookup lookup = MethodHandles.publicLookup();
        for (Rewriter.Redirect r : Rewriter.REDIRECTS.values()) {
            MethodTypeDesc t = MethodTypeDesc.ofDescriptor(r.type());
            if (r.virtual()) t = t.insertParameterTypes(0, ClassDesc.of("java.lang.Object"));
            MethodType mt = (MethodType) t.resolveConstantDesc(lookup);
            try {
                lookup.findStatic(r.guard(), r.name(), mt);
            } catch (NoSuchMethodException | IllegalAccessException e) {
                missing.add(r.owner() + "." + r.name() + r.type() + " -> " + r.guard().getSimpleName() + "." + r.name() + mt);
            }
        }
        assertEquals(List.of(), missing, "rewritten calls without their guard method");
    }
}
