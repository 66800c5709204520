package io.headrace.fs;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;

/** `fs.AbstractFileSystem.file.impl`: Hadoop's checksummed local FileContext file system over {@link NioRawLocalFs}. */
public class NioLocalFs extends ChecksumFs {
  public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new NioRawLocalFs(uri, conf));
  }
}
