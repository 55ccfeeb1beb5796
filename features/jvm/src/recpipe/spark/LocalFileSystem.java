package recpipe.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's checksummed local file system ({@code file://}) whose permission changes are system
 * calls, not processes.
 *
 * <p>Without Hadoop's native library (pyspark ships none), {@link RawLocalFileSystem} sets a
 * permission by running {@code chmod}: a process started from the JVM for every file and
 * directory a job writes, (its data files, their checksums, the committer's temporary
 * directories). This one sets the same bits through {@link Files#setPosixFilePermissions}. A
 * permission with the sticky bit, which that cannot set, is left to Hadoop's own way.
 *
 * <p>Spark reads it from {@code spark.hadoop.fs.file.impl=recpipe.spark.LocalFileSystem}, with
 * the jar on the driver's class path ({@code features/jvm.py}'s {@code session_conf}, local
 * masters only: executors elsewhere may not hold the jar).
 */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new Raw());
  }

  /** The raw (checksum-free) half, where permissions are set. */
  public static class Raw extends RawLocalFileSystem {
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE,
      PosixFilePermission.OTHERS_WRITE,
      PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE,
      PosixFilePermission.GROUP_WRITE,
      PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE,
      PosixFilePermission.OWNER_WRITE,
      PosixFilePermission.OWNER_READ,
    };

    /** The POSIX permissions of the low nine bits of {@code mode}. */
    static Set<PosixFilePermission> posix(short mode) {
      Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
      for (int i = 0; i < BITS.length; i++) {
        if ((mode & (1 << i)) != 0) {
          out.add(BITS[i]);
        }
      }
      return out;
    }

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {
        super.setPermission(p, permission);
        return;
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission.toShort()));
    }
  }
}
