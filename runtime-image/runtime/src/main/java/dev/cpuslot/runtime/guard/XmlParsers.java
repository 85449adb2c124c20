package dev.cpuslot.runtime.guard;

/**
 * XML parsers that read no external resources: the process's defaults, and the properties a
 * function sets on its parser ({@link Rewriter} redirects them here). No state of its own.
 */
public final class XmlParsers {
    private XmlParsers() {}

    /**
     * The JDK's XML parsers of every function resolve no external DTD, entity, schema or
     * stylesheet (a parser opens those itself, past the path checks): the JAXP properties'
     * defaults, set once for the process (System.setProperty is refused to functions).
     */
    public static void secureXml() {
        for (String p : new String[] {"javax.xml.accessExternalDTD", "javax.xml.accessExternalSchema", "javax.xml.accessExternalStylesheet"})
            System.setProperty(p, "");
    }

    /**
     * A property a function sets on its parser: refused when it would let the parser reach
     * external resources, or name a catalog (a file the parser opens itself, unchecked).
     */
    private static void xml(String name, Object value) {
        String n = name == null ? "" : name.toLowerCase(java.util.Locale.ROOT);
        if (n.contains("accessexternal") && !"".equals(value)) {
            throw new SecurityException(name + "=" + value + ": an XML parser reading external resources is " + Rewriter.NOT_ALLOWED);
        }
        if (n.contains("catalog")) {
            throw new SecurityException(name + ": an XML catalog is " + Rewriter.NOT_ALLOWED);
        }
    }

    public static void setAttribute(Object factory, String name, Object value) {
        xml(name, value);
        ((javax.xml.parsers.DocumentBuilderFactory) factory).setAttribute(name, value);
    }

    public static void setProperty(Object target, String name, Object value) throws org.xml.sax.SAXException {
        xml(name, value);
        switch (target) {
            case javax.xml.parsers.SAXParser p -> p.setProperty(name, value);
            case org.xml.sax.XMLReader r -> r.setProperty(name, value);
            case javax.xml.stream.XMLInputFactory f -> f.setProperty(name, value);
            case javax.xml.validation.SchemaFactory f -> f.setProperty(name, value);
            case javax.xml.validation.Validator v -> v.setProperty(name, value);
            case javax.xml.validation.ValidatorHandler v -> v.setProperty(name, value);
            default -> throw new IllegalStateException("not an XML parser: " + target.getClass().getName());
        }
    }
}
