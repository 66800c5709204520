package io.headrace.fs;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without a process per file: without Hadoop's native library it runs
 * `chmod` for every file and directory it creates and `readlink` for every link status it is asked
 * (a fork of the whole JVM each, ~5 ms). Java's own file API does both in the same process.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    int mode = permission.toShort();
    java.nio.file.Path path = pathToFile(p).toPath();
    if ((mode & ~0777) != 0 || hasSetIdBits(path)) {
      super.setPermission(p, permission); // sticky, setuid, setgid: only chmod(1) sets or keeps them
      return;
    }
    Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        perms.add(BITS[bit]);
      }
    }
    Files.setPosixFilePermissions(path, perms);
  }

  /**
   * A directory with its set-user-ID or set-group-ID bit (the lake directory's setgid, so what is
   * made there keeps the drivers' group): chmod(1), given the four-digit octal mode Hadoop passes,
   * keeps those bits on a directory, while chmod(2), which java.nio calls, would clear them.
   */
  private static boolean hasSetIdBits(java.nio.file.Path path) throws IOException {
    if (!Files.isDirectory(path)) {
      return false;
    }
    int current = (Integer) Files.getAttribute(path, "unix:mode");
    return (current & 06000) != 0;
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    File file = pathToFile(f);
    if (Files.isSymbolicLink(file.toPath())) {
      return super.getFileLinkStatus(f); // a link: Hadoop's own answer, rare enough to fork for
    }
    return getFileStatus(f);
  }
}
