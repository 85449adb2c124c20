package dev.cpuslot.runtime.guard;

import java.lang.classfile.CodeBuilder;
import java.lang.classfile.Opcode;
import java.lang.classfile.TypeKind;
import java.lang.classfile.instruction.InvokeInstruction;
import java.lang.constant.ClassDesc;
import java.lang.constant.ConstantDescs;
import java.lang.constant.MethodTypeDesc;
import java.util.List;
import java.util.Set;

/**
 * Which JDK calls of a function's code name a file, and the check inserted before them: every
 * {@code File} and {@code Path} argument of a JDK method (but {@code Path}'s and {@code File}'s own
 * path arithmetic and metadata queries), the file name of the stream constructors that take one as
 * a {@code String}, the {@code File} whose listing or contents a method changes, and the
 * {@code URL} a stream is opened on. {@link FileAccess#path} decides; the call then runs as written.
 * Java has no single place where a path is opened ({@code java.io} opens natively, beside
 * {@code java.nio}'s providers), so the calls are found where the function makes them.
 */
final class FilePaths {
    private FilePaths() {}

    /** What to check before a call: the receiver (a File or URL), and which parameters (systemId: a String one is an XML system id). */
    record Check(boolean receiver, ClassDesc receiverType, boolean[] params, boolean systemId) {}

    /** XML calls whose first parameter, a String, is a system id the parser then opens itself (a URI, or a path). */
    private static final Set<String> SYSTEM_IDS = Set.of("javax/xml/parsers/DocumentBuilder.parse", "javax/xml/parsers/SAXParser.parse",
            "org/xml/sax/XMLReader.parse", "org/xml/sax/InputSource.<init>", "org/xml/sax/InputSource.setSystemId",
            "javax/xml/transform/stream/StreamSource.<init>", "javax/xml/transform/stream/StreamSource.setSystemId");

    private static final ClassDesc FILE = ClassDesc.of("java.io.File"), PATH = ClassDesc.of("java.nio.file.Path"),
            URL = ClassDesc.of("java.net.URL");

    /** Constructors whose first parameter, a String, is a file name. */
    private static final Set<String> NAME_CONSTRUCTORS = Set.of("java/io/FileInputStream", "java/io/FileOutputStream",
            "java/io/RandomAccessFile", "java/io/FileReader", "java/io/FileWriter", "java/io/PrintStream", "java/io/PrintWriter",
            "java/util/Formatter", "java/util/zip/ZipFile", "java/util/jar/JarFile");

    /** File's methods that list, create, change or remove what its path names. */
    private static final Set<String> FILE_CHANGES = Set.of("list", "listFiles", "delete", "deleteOnExit", "renameTo", "mkdir",
            "mkdirs", "createNewFile", "setReadable", "setWritable", "setExecutable", "setReadOnly", "setLastModified");

    /** Files' queries that read no contents: not checked (a method reference to them stays allowed). */
    private static final Set<String> FILES_METADATA = Set.of("exists", "notExists", "isDirectory", "isRegularFile",
            "isSymbolicLink", "isReadable", "isWritable", "isExecutable", "isHidden", "isSameFile", "size", "getLastModifiedTime");

    /** The check a call of owner.name with this descriptor needs, or null. */
    static Check checked(String owner, String name, String type) {
        if (SYSTEM_IDS.contains(owner + "." + name)) {
            List<ClassDesc> ps = MethodTypeDesc.ofDescriptor(type).parameterList();
            if (ps.isEmpty() || !ps.get(0).equals(ConstantDescs.CD_String)) return null; // a stream: its system id only names a base
            boolean[] params = new boolean[ps.size()];
            params[0] = true;
            return new Check(false, null, params, true);
        }
        if (!owner.startsWith("java/") && !owner.startsWith("javax/")) return null;
        if (owner.equals("java/nio/file/Path") || owner.equals("java/nio/file/Paths")) return null; // path arithmetic
        if (owner.equals("java/nio/file/Files") && FILES_METADATA.contains(name)) return null;
        List<ClassDesc> ps = MethodTypeDesc.ofDescriptor(type).parameterList();
        boolean[] params = new boolean[ps.size()];
        boolean receiver = false;
        ClassDesc receiverType = null;
        if (owner.equals("java/io/File")) {
            if (!FILE_CHANGES.contains(name)) return null; // constructors, path arithmetic, metadata
            receiver = true;
            receiverType = FILE;
        } else if (owner.equals("java/net/URL") && Set.of("openStream", "openConnection", "getContent").contains(name)) {
            receiver = true;
            receiverType = URL;
        }
        boolean any = receiver;
        for (int k = 0; k < ps.size(); k++) {
            if (ps.get(k).equals(FILE) || ps.get(k).equals(PATH)) params[k] = any = true;
        }
        if (name.equals("<init>") && NAME_CONSTRUCTORS.contains(owner) && !ps.isEmpty() && ps.get(0).equals(ConstantDescs.CD_String)) {
            params[0] = any = true;
        }
        return any ? new Check(receiver, receiverType, params, false) : null;
    }

    /**
     * Emits the check before call i: the arguments go to new locals (from the top of the stack),
     * the receiver and each path argument are checked, the arguments come back in order.
     */
    static void emit(CodeBuilder cob, InvokeInstruction i, Check c, ClassDesc guard) {
        List<ClassDesc> ps = i.typeSymbol().parameterList();
        int[] slots = new int[ps.size()];
        for (int k = ps.size() - 1; k >= 0; k--) {
            TypeKind t = TypeKind.from(ps.get(k));
            slots[k] = cob.allocateLocal(t);
            cob.storeLocal(t, slots[k]);
        }
        if (c.receiver() && i.opcode() != Opcode.INVOKESTATIC) {
            cob.dup();
            cob.invokestatic(guard, "path", MethodTypeDesc.of(ConstantDescs.CD_void, c.receiverType()));
        }
        for (int k = 0; k < ps.size(); k++) {
            if (!c.params()[k]) continue;
            cob.loadLocal(TypeKind.from(ps.get(k)), slots[k]);
            cob.invokestatic(guard, c.systemId() ? "systemId" : "path", MethodTypeDesc.of(ConstantDescs.CD_void, ps.get(k)));
        }
        for (int k = 0; k < ps.size(); k++) cob.loadLocal(TypeKind.from(ps.get(k)), slots[k]);
    }
}
