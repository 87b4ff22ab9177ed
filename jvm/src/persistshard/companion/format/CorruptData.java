package persistshard.companion.format;

/**
 * Stored bytes of a part fail a check: magic, version, length, checksum or structure.
 *
 * <p>The JVM twin of Python's {@code persistshard.CorruptData}: the message starts with the
 * class name and ends naming the file and, where the bad bytes belong to one, the chunk, in
 * the same words ({@code (file NAME, chunk N)}).
 */
public final class CorruptData extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The part's name as the reader was given it. */
  public final String file;

  /** The chunk the bad bytes belong to, or -1 when none does (header, footer, tail). */
  public final int chunk;

  public CorruptData(String message, String file, int chunk) {
    this(message, file, chunk, null);
  }

  public CorruptData(String message, String file, int chunk, Throwable cause) {
    super(
        "CorruptData: "
            + message
            + " (file "
            + file
            + (chunk >= 0 ? ", chunk " + chunk : "")
            + ")",
        cause);
    this.file = file;
    this.chunk = chunk;
  }
}
