package testfns;

import java.util.Map;

public class ReturnsString {
    public static Object main(Map<String, Object> args) { return "not an object"; }
}
