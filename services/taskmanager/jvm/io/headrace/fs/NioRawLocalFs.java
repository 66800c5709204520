package io.headrace.fs;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.RawLocalFs;

/**
 * The raw local file system of FileContext (which Delta's log store uses) over
 * {@link NioRawLocalFileSystem}: a link status asked of the file itself rather than
 * of `readlink`.
 */
public class NioRawLocalFs extends DelegateToFileSystem {
  public NioRawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
  }

  @Override
  public int getUriDefaultPort() {
    return -1;
  }

  @Override
  public FsServerDefaults getServerDefaults(Path f) throws IOException {
    return fsImpl.getServerDefaults(f);
  }

  @Override
  public boolean isValidName(String src) {
    return true;
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    return fsImpl.getFileLinkStatus(f);
  }
}
